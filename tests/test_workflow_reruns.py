"""End-to-end reruns on the demo (conftest's session fixture): what each kind of change reruns, what a
failure costs, and how one plain rerun finishes the job."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from demo import CELLS, VENV, first_run_id, jobs_run, run, train_digest

pytestmark = pytest.mark.e2e


def test_an_evaluation_setting_reruns_only_the_evaluation_stages_that_read_it_and_the_report(demo, workdir):
    out = run(["snakemake", "-n", "--config", "matrix={bootstrap: 100}"], workdir)
    assert jobs_run(out.stdout + out.stderr) == {"score_cell": len(CELLS), "matrix": 1, "report": 1, "all": 1}


def test_the_interconnect_settings_rerun_nothing(demo, workdir):
    """The train rule's interconnect_env resource (docs/options.md#interconnect-settings): another value, after a
    complete run, is nothing to do (environment, not config: no param, no run identity)."""
    run(["snakemake", "--cores", "2"], workdir)
    given = ["--set-resources", "train:interconnect_env=NCCL_DEBUG=INFO FI_PROVIDER=efa"]
    out = run(["snakemake", "-n", *given], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]
    forced = run(["snakemake", "-n", "-p", "--forcerun", "train", *given], workdir)
    assert "--interconnect-env 'NCCL_DEBUG=INFO FI_PROVIDER=efa'" in forced.stdout, forced.stdout[-3000:]


def test_an_execution_setting_reruns_nothing_and_applies_at_the_next_run(demo, workdir):
    """Workers, ports, retention, logging: how work runs, not what it makes. Flipped, nothing complete reruns
    (Snakemake and verify agree); the stages' config files hold the new values, which the next run of a stage
    uses (one cell's scoring forced: the scorer pool has the new size); and flipped back, nothing reruns either."""
    run(["snakemake", "--cores", "2"], workdir)
    run_id = first_run_id(workdir)
    before = train_digest(workdir, run_id)
    made = {path: path.stat().st_mtime_ns for path in (workdir / "results").rglob("*.manifest.json")}
    override = [
        "--config",
        "logging={wandb_mode: disabled}",
        "train={keep_checkpoints: 3}",
        "parallel={master_port: 29871, cpu_threads: 1}",
        "evalkit={workers: 2, threads_per_worker: 2}",
    ]
    for argv in (["snakemake", "-n", *override], ["snakemake", "--cores", "2", *override]):
        out = run(argv, workdir)
        assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]
        # Neither a dry run nor a run with nothing to do writes anything, nor says what a run would write.
        assert not [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    # the demo's base cell: beside its trained one (runs that generate otherwise have base cells of their own)
    (trained,) = workdir.glob(f"results/matrix/*/{run_id}/unipc")
    (cell,) = trained.parent.parent.glob("base-*/unipc")
    scores = str((cell / "scores.csv").relative_to(workdir))
    out = run(["snakemake", "--cores", "2", "--forcerun", scores, *override], workdir)
    assert jobs_run(out.stdout + out.stderr) == {"score_cell": 1, "matrix": 1, "report": 1, "all": 1}
    # The first run that starts writes the stages' config files and says, once per stage, what changed.
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    (note,) = [line for line in notes if line.startswith("note: train: ")]
    assert "evalkit.workers 1 -> 2" in note and "parallel.master_port 29500 -> 29871" in note, note
    assert note.endswith("next run applies it (`--forcerun train` reruns it and what follows it)"), note
    (scoring,) = [line for line in notes if line.startswith("note: score_cell: ")]
    assert "evalkit.workers 1 -> 2" in scoring and "evalkit.threads_per_worker 1 -> 2" in scoring, scoring
    configs = [json.loads(p.read_text()) for p in (workdir / "results/.stage-config").glob("score_cell-*.json")]
    assert any(c["evalkit"]["workers"] == 2 and c["evalkit"]["threads_per_worker"] == 2 for c in configs)
    log = (cell / "score_cell.log").read_text()
    assert "scoring with 2 scorer workers (evalkit.workers)" in log, log[-2000:]
    assert train_digest(workdir, run_id) == before
    out = run(["snakemake", "-n"], workdir)  # back to the defaults
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]
    changed = [p for p, ns in made.items() if p.stat().st_mtime_ns != ns]
    assert sorted(p.name for p in changed) == [
        "matrix.manifest.json",
        "report.manifest.json",
        "score_cell.manifest.json",
    ]
    assert cell / "score_cell.manifest.json" in changed


def test_a_cosmetic_label_and_other_data_fields_never_download_again(demo, workdir):
    out = run(["snakemake", "-n", "--config", "logging={wandb_project: renamed}"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr  # a label: the same run, nothing to redo
    out = run(["snakemake", "-n", "--config", "model={max_text_tokens: 16}", "data={heldout_per_task: 1}"], workdir)
    jobs = jobs_run(out.stdout + out.stderr)
    assert "fetch_model" not in jobs and "fetch_dataset" not in jobs and jobs["materialize_dataset"] == 1


def test_the_evalkit_is_pinned_by_its_digest_and_where_it_lives_reruns_nothing(demo, workdir):
    """evalkit.path is an execution field: a copy elsewhere with the pinned digest reruns nothing. A path with no
    checkout is said in a dry run (which plans nothing: nothing has to read it), and a run that must read it stops
    before any job, saying it once for every job it stops, and writing nothing: the good records and the record of
    the last run that started stay as they were."""
    run(["snakemake", "--cores", "2"], workdir)
    good = sorted(workdir.glob("results/evalkit/*/fingerprint.json"))
    assert len(good) == 1
    shutil.copytree(workdir / "src/videogrpo/demo/stand_in_evalkit", workdir / "kit-elsewhere")
    moved = run(["snakemake", "-n", "--config", "evalkit={path: kit-elsewhere}"], workdir)
    assert "Nothing to be done" in moved.stdout + moved.stderr, moved.stderr[-2000:]
    assert "warning: evalkit.path" not in moved.stderr
    bad = ["--config", "evalkit={path: no/such/checkout}"]
    line = "evalkit.path = 'no/such/checkout': no such directory; point it at an EvalKit checkout"
    dry = run(["snakemake", "-n", *bad], workdir)
    assert "Nothing to be done" in dry.stdout + dry.stderr and (dry.stdout + dry.stderr).count(line) == 1
    recorded = {path: path.read_bytes() for path in (workdir / "results/.stage-config").iterdir()}
    out = run(["snakemake", "--cores", "2", "--forcerun", "score_cell", *bad], workdir, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and STOPPED in text and "Error in rule" not in text, text[-3000:]
    assert f"  - score_cell ({len(CELLS)} jobs): {line}" in text, text[-3000:]
    assert text.count(line) == 2  # the warning when the workflow is read, and the refusal once
    assert sorted(workdir.glob("results/evalkit/*/fingerprint.json")) == good
    assert {path: path.read_bytes() for path in (workdir / "results/.stage-config").iterdir()} == recorded
    assert "Nothing to be done" in run(["snakemake", "-n"], workdir).stdout


def snapshot(*folders: Path) -> dict[Path, bytes]:
    """Every file under the folders, with its bytes: what a failure must not cost."""
    return {path: path.read_bytes() for folder in folders for path in sorted(folder.rglob("*")) if path.is_file()}


STOPPED = "the run stopped before it started, and every output is as it was"


def test_a_tampered_output_never_reaches_the_next_stage_and_costs_nothing(demo, workdir):
    """A hand-edited table and a corrupted weight file are refused by the check when the run starts, before any
    job, naming the file and the fix; the report, and the trained model's cells under --forcerun, stay as they
    were."""
    run(["snakemake", "--cores", "2"], workdir)  # up to date first: only the tampering is left to find
    run_dir = workdir / "results/runs" / first_run_id(workdir)
    table = run_dir / "matrix/per_task.csv"
    original = table.read_text()
    report = snapshot(run_dir / "report")
    table.write_text(original.replace(",ALL,", ",ALL ,", 1))  # a hand edit
    try:
        out = run(["snakemake", "--cores", "2", "report"], workdir, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and STOPPED in text and "Error in rule report" not in text
        assert "per_task.csv: input per_task is not what matrix made" in text
        assert snapshot(run_dir / "report") == report  # the previous report is kept
    finally:
        table.write_text(original)
    weights = run_dir / "train/final/transformer/diffusion_pytorch_model.safetensors"
    good = weights.read_bytes()
    (check_cell,) = workdir.glob(f"results/matrix/*/{run_dir.name}/flowcps-0.7")  # the held-out check's
    evaluation = snapshot(check_cell.parent)
    weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one flipped bit
    try:
        # Re-evaluation as the README shows it: the matrix and the report present the trained model, so both
        # refuse weights that are not the ones train made (and the cells evaluated), before the report is remade.
        out = run(["snakemake", "--cores", "2", "--forcerun", "matrix"], workdir, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and STOPPED in text and "Error in rule" not in text
        assert "matrix, report: " in text and "train/final: input model:trained is not what train made" in text
        assert snapshot(run_dir / "report") == report
        videos = str((check_cell / "videos").relative_to(workdir))
        out = run(["snakemake", "--cores", "2", "--forcerun", videos], workdir, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and STOPPED in text and "Error in rule generate_cell" not in text
        assert "input final is not what train made" in text
        assert "files that differ: transformer/diffusion_pytorch_model.safetensors" in text
        assert snapshot(check_cell.parent) == evaluation  # even forced, nothing of the evaluation is lost
        # The message's other way out: training made again (resumed from its checkpoints, re-exported); what
        # follows it reruns in the next test's plain rerun.
        assert "or rerun train (snakemake --forcerun train)" in text
        run(["snakemake", "--cores", "2", "--forcerun", "train", "train"], workdir)
        assert weights.read_bytes() == good
    finally:
        if weights.read_bytes() != good:
            weights.write_bytes(good)


def test_a_truncated_manifest_costs_nothing_and_its_message_is_the_fix(demo, workdir):
    """Downstream stages refuse a cut-short train manifest before anything of theirs is deleted; the message's
    command (rm it, then a plain rerun) rebuilds it: training resumes, and verify passes."""
    run(["snakemake", "--cores", "2", "train"], workdir)  # what follows train may be stale: the plain rerun makes it
    run_dir = workdir / "results/runs" / first_run_id(workdir)
    (trained_cells,) = {p.parent.parent for p in workdir.glob(f"results/matrix/*/{run_dir.name}/*/scores.csv")}
    kept = snapshot(run_dir / "matrix", trained_cells)
    manifest = run_dir / "train.manifest.json"
    manifest.write_text(manifest.read_text()[:500])
    out = run(["snakemake", "--cores", "2"], workdir, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and STOPPED in text
    fix = re.search(r"cut short or edited: `(rm \S+)`, then `(snakemake --cores <N>)`", text)
    assert fix and fix.group(1) == f"rm {manifest.relative_to(workdir)}", text[-3000:]
    assert snapshot(run_dir / "matrix", trained_cells) == kept
    run(fix.group(1).split(), workdir)
    run(fix.group(2).replace("<N>", "2").split(), workdir)
    assert "resumed from" in (run_dir / "logs/train.log").read_text()
    assert run(["videogrpo", "verify", str(run_dir.relative_to(workdir))], workdir).returncode == 0


def test_a_comment_reruns_nothing_and_an_edit_of_the_sampler_reruns_what_runs_it(demo, workdir):
    """Code identity (provenance/code.py): a comment or docstring in any module of the package reruns nothing; a
    change of grpo/samplers.py reruns exactly the stages whose code runs it (preflight, train and every cell's
    generation; the stages downstream of them as their inputs change) and nothing upstream."""
    env = {"PYTHONPATH": str(workdir / "src")}
    package = workdir / "src/videogrpo"
    # every module but the stand-ins for pinned external files (their bytes are pinned by digest in the config)
    sources = [p for p in sorted(package.rglob("*.py")) if not any(part.startswith("stand_in") for part in p.parts)]
    originals = {path: path.read_text() for path in sources}
    try:
        for path in sources:
            path.write_text(originals[path] + "\n# a comment is no code\n")
        samplers = package / "grpo/samplers.py"
        samplers.write_text(samplers.read_text().replace('"""', '"""A docstring edit. ', 1))
        out = run(["snakemake", "-n"], workdir, **env)
        assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]
        samplers.write_text(originals[samplers] + "\n\ndef unused_helper():\n    return 0\n")
        out = run(["snakemake", "-n"], workdir, **env)
        jobs = jobs_run(out.stdout + out.stderr)
        assert {"train", "preflight", "generate_cell", "matrix", "report"} <= set(jobs), jobs
        assert jobs["generate_cell"] == len(CELLS) and jobs["score_cell"] == len(CELLS)
        assert not set(jobs) & {
            "fetch_model",
            "fetch_dataset",
            "materialize_dataset",
            "validate_dataset",
            "fingerprint_evalkit",
            "check_scorer_runtime",
            "eval_set",
        }, jobs
    finally:
        for path, text in originals.items():
            path.write_text(text)


def test_training_resumes_across_a_comment_and_refuses_a_changed_loss_until_allowed(demo, workdir):
    """The trainer's resume guard digests the same syntax: a comment in the trainer is no change of its math (the
    forced rerun resumes); a change of the loss is refused until the user allows it. Only up to train: what
    follows it reruns as after any training."""
    env = {"PYTHONPATH": str(workdir / "src")}
    run_id = first_run_id(workdir)
    package = workdir / "src/videogrpo"
    originals = {rel: (package / rel).read_text() for rel in ("grpo/trainer.py", "grpo/loss.py")}
    try:
        (package / "grpo/trainer.py").write_text(originals["grpo/trainer.py"] + "\n# a comment is not math\n")
        out = run(["snakemake", "--cores", "2", "--forcerun", "train", "train"], workdir, **env)
        assert jobs_run(out.stdout + out.stderr)["train"] == 1
        log = (workdir / "results/runs" / run_id / "logs/train.log").read_text()
        assert "resumed from" in log and "(update 4 of 4)" in log
        (package / "grpo/loss.py").write_text(
            originals["grpo/loss.py"].replace(
                "    log_ratio = logp_new - logp_old.detach()\n",
                "    log_ratio = logp_new - logp_old.detach()\n    clip_range = float(clip_range)\n",
            )
        )
        out = run(["snakemake", "--cores", "2", "train"], workdir, check=False, **env)
        assert out.returncode != 0 and "Error in rule train" in out.stdout + out.stderr
        log = (workdir / "results/runs" / run_id / "logs/train.log").read_text()
        assert "the trainer's math changed since it was written (grpo/loss.py)" in log
        assert "train.resume_across_code_changes: true" in log
        run(
            ["snakemake", "--cores", "2", "train", "--config", "train={resume_across_code_changes: true}"],
            workdir,
            **env,
        )
        assert "resumed from" in (workdir / "results/runs" / run_id / "logs/train.log").read_text()
    finally:
        for rel, text in originals.items():
            (package / rel).write_text(text)


def test_a_raw_video_overwritten_in_place_is_named_and_the_suggested_command_repairs_it(demo, workdir):
    """The dataset's raw/ is no declared input of train (Snakemake would otherwise plan its deletion), so
    `snakemake -n` cannot see an edit there; verify names it with the command that rebuilds it, and the check when
    the run starts covers what each stage reads: a forced training stops before Snakemake removes train's
    outputs, naming the file and the same fix. Followed as written, that command repairs the file (its change time
    moved), and with train/final removed as well, the one run makes that again too (the default target requests
    every declared output). No plain run first: what the test before left stale (training, after its code edits)
    is made by the same command, once."""
    run_dir = workdir / "results/runs" / first_run_id(workdir)
    (raw,) = workdir.glob("results/data/*/materialized/raw")
    victim = sorted(raw.glob("*/*/video/ground_truth.mp4"))[0]
    good = victim.read_bytes()
    kept = snapshot(run_dir / "train")
    st = victim.stat()
    victim.write_bytes(good[: len(good) // 2] + bytes([good[len(good) // 2] ^ 0xFF]) + good[len(good) // 2 + 1 :])
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only a hash can tell
    try:
        dry = run(["snakemake", "-n"], workdir)
        assert "materialize_dataset" not in (jobs_run(dry.stdout) if "Job stats:" in dry.stdout else {})
        checked = run(["videogrpo", "verify", str(run_dir.relative_to(workdir))], workdir, check=False)
        assert checked.returncode == 4 and f"CHANGED {victim.relative_to(workdir)}" in checked.stdout
        # The run's own invocation (the test before left a --config override in it) and the stage to force.
        hint = re.search(r"rebuild what changed or is missing with `(snakemake --cores <N>[^`]*)`", checked.stdout)
        assert hint and hint.group(1).endswith(" --forcerun materialize_dataset"), checked.stdout[-2000:]
        out = run(["snakemake", "--cores", "2", "--forcerun", "train"], workdir, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and STOPPED in text and "Error in rule" not in text
        assert f"files that differ: {victim.relative_to(raw)}" in text
        assert "rerun materialize_dataset (snakemake --forcerun materialize_dataset)" in text
        assert snapshot(run_dir / "train") == kept and (run_dir / "train.manifest.json").is_file()
    except BaseException:
        victim.write_bytes(good)
        raise
    shutil.rmtree(run_dir / "train/final")
    dry = run(["snakemake", "-n"], workdir)
    assert "Missing output files: " in dry.stdout and f"{run_dir.relative_to(workdir)}/train/final" in dry.stdout
    # verify's command, as written (with the cores a run here has), which forces what the start check's names:
    run(shlex.split(hint.group(1).replace("<N>", "2")), workdir)
    assert victim.read_bytes() == good
    assert (
        f"repairing raw/{victim.relative_to(raw)}"
        in next(workdir.glob("results/data/*/materialize_dataset.log")).read_text()
    )
    assert (run_dir / "train/final").is_dir() and "resumed from" in (run_dir / "logs/train.log").read_text()
    assert run(["videogrpo", "verify", str(run_dir.relative_to(workdir))], workdir).returncode == 0


def test_a_removed_dataset_is_made_again_by_a_plain_rerun(demo, workdir):
    """The dataset's index files are read by stages that are up to date, so only the default target's request
    makes them again: a dry run plans the unpack and what follows it."""
    (materialized,) = workdir.glob("results/data/*/materialized")
    aside = workdir / "moved-aside"
    materialized.rename(aside)
    try:
        out = run(["snakemake", "-n"], workdir)
        assert jobs_run(out.stdout)["materialize_dataset"] == 1, out.stdout[-3000:]
        assert f"Missing output files: {materialized.relative_to(workdir)}/" in out.stdout
    finally:
        aside.rename(materialized)
    assert "Nothing to be done" in run(["snakemake", "-n"], workdir).stdout


def test_an_edit_of_the_evaluation_code_generates_and_scores_again(demo, workdir):
    """A cell's videos and scores are keyed by the code that made them: generation edited to make black videos
    gives other scores (not the old ones re-emitted), and the original code gives the original scores back. One
    cell of the held-out check, as its target."""
    env = {"PYTHONPATH": str(workdir / "src")}
    (cell,) = workdir.glob(f"results/matrix/*/{first_run_id(workdir)}/flowcps-0.7")
    scores = cell / "scores.csv"
    target = str(scores.relative_to(workdir))
    original_scores = scores.read_bytes()
    source = workdir / "src/videogrpo/evaluation/generate.py"
    original = source.read_text()
    decode = "    return model.decode(sampling.sample_latents("
    assert decode in original
    try:
        source.write_text(original.replace(decode, decode.replace("return ", "return 0 * ")))
        out = run(["snakemake", "--cores", "2", target], workdir, **env)
        assert jobs_run(out.stdout + out.stderr) == {"generate_cell": 1, "score_cell": 1}
        assert scores.read_bytes() != original_scores
    finally:
        source.write_text(original)
    run(["snakemake", "--cores", "2", target], workdir, **env)
    assert scores.read_bytes() == original_scores


def test_ctrl_c_during_a_forced_training_then_one_plain_rerun_finishes_the_job(demo, workdir):
    """Ctrl-C (SIGINT to the terminal's process group) while `--forcerun train` runs: Snakemake removes the
    job's outputs while report.html stays; `snakemake -n` still lists training, verify names each missing
    manifest, and a plain rerun resumes training and rebuilds every stage whose outputs were removed."""
    run(["snakemake", "--cores", "2"], workdir)
    run_dir = workdir / "results/runs" / first_run_id(workdir)
    manifest, log = run_dir / "train.manifest.json", run_dir / "logs/train.log"
    started, output = time.time(), workdir / "interrupted-train.out"

    def training_runs() -> bool:  # its outputs removed, its log begun by this attempt
        begun = log.is_file() and log.stat().st_mtime > started and "[launch]" in log.read_text()
        return begun and not manifest.exists()

    with open(output, "wb") as sink:
        proc = subprocess.Popen(
            ["snakemake", "--cores", "2", "--forcerun", "train"],
            cwd=workdir,
            env=dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # SIGINT as a terminal's Ctrl-C finds it, whatever pytest inherited: a shell without job control (`make
            # test &` in a script, nohup) starts its background commands with SIGINT ignored, and an ignored signal
            # stays ignored across fork and exec. Snakemake's own children need nothing more: Python handles SIGINT
            # once it is not ignored, and a handled signal is reset to its default in the processes it starts.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 300
        while not training_runs():
            assert proc.poll() is None and time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not manifest.exists() and (run_dir / "report/report.html").is_file()
    # As after failures of the later stages too, whose outputs Snakemake removes likewise: verify names every
    # missing manifest (exit 4) with the command that rebuilds it.
    removed = [manifest, *(run_dir / f"{stage}.manifest.json" for stage in ("matrix", "report"))]
    for path in removed[1:]:
        path.unlink()
    dry = run(["snakemake", "-n"], workdir)
    assert {"train": 1, "matrix": 1, "report": 1}.items() <= jobs_run(dry.stdout + dry.stderr).items()
    checked = run(["videogrpo", "verify", str(run_dir.relative_to(workdir))], workdir, check=False)
    assert checked.returncode == 4
    for path in removed:
        stage = path.name.removesuffix(".manifest.json")
        assert f"MISSING {path.relative_to(workdir)}: manifest of stage {stage} missing; rebuild it with" in (
            checked.stdout + checked.stderr
        )
    assert "`snakemake --cores <N>` (a plain rerun rebuilds" in checked.stdout + checked.stderr
    run(["snakemake", "--cores", "2"], workdir)
    assert all(path.is_file() for path in removed)
    assert "resumed from" in log.read_text()
    assert run(["videogrpo", "verify", str(run_dir.relative_to(workdir))], workdir).returncode == 0


def test_a_scripts_background_driver_ignores_sigint_and_on_sigterm_stops_after_its_running_job(demo, workdir):
    """docs/reruns.md: `snakemake ... &` in a script (a shell without job control) runs with SIGINT ignored, so
    `kill -INT` changes nothing; `kill -TERM` of the Snakemake process lets the running job (one matrix cell's
    generation, forced) finish, starts no other, and a plain rerun runs the rest."""
    run(["snakemake", "--cores", "2"], workdir)
    (cell,) = workdir.glob(f"results/matrix/*/{first_run_id(workdir)}/unipc")
    log, made = cell / "generate_cell.log", cell / "generate_cell.manifest.json"
    started, output, pid_file = time.time(), workdir / "background-driver.out", workdir / "background-driver.pid"
    forced = made.relative_to(workdir)
    script = f"snakemake --cores 2 --forcerun {forced} > {output.name} 2>&1 & echo $! > {pid_file.name}; wait $!"
    env = dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(["bash", "-c", script], cwd=workdir, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (log.is_file() and log.stat().st_mtime > started and not made.exists()):  # the forced job runs
            assert proc.poll() is None and time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.2)
        driver = int(pid_file.read_text())
        status = Path(f"/proc/{driver}/status").read_text()
        assert int(re.search(r"^SigIgn:\s+(\w+)$", status, re.M).group(1), 16) & 1 << (signal.SIGINT - 1)
        os.kill(driver, signal.SIGINT)
        time.sleep(2)
        os.kill(driver, signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = output.read_text()
    assert proc.returncode != 0  # the driver's own status: the run did not finish
    assert "Will exit after finishing currently running jobs" in said, said[-3000:]
    assert "Terminating processes on user request" not in said  # what Snakemake says on SIGINT
    assert set(jobs_run(said)) == {"generate_cell", "score_cell", "matrix", "report", "all"}  # the jobs planned
    assert made.is_file() and said.count("Finished jobid") == 1, said[-3000:]  # the running one ended, no other ran
    dry = run(["snakemake", "-n"], workdir)
    assert jobs_run(dry.stdout + dry.stderr) == {"score_cell": 1, "matrix": 1, "report": 1, "all": 1}
    run(["snakemake", "--cores", "2"], workdir)
    out = run(["snakemake", "-n"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]


def test_a_failed_experiment_costs_no_shared_output(demo, workdir):
    """A judge run whose endpoint is dead fails naming the field; the EvalKit's records and the base model's
    matrix cells, shared with the demo run, are neither made again nor invalidated: the demo has nothing to
    do afterwards."""
    run(["snakemake", "--cores", "2"], workdir)
    shared = [*workdir.glob("results/evalkit/*/*"), *workdir.glob("results/matrix/*/base-*/*/*")]
    made = {path: path.stat().st_mtime_ns for path in shared if path.is_file()}
    assert any(p.name == "fingerprint.json" for p in made) and any(p.name == "scores.csv" for p in made)
    judge = ["--config", "reward={kind: vbvr_vlm, judge_endpoint: 'http://127.0.0.1:9/v1', judge_ready_timeout_s: 2}"]
    out = run(["snakemake", "--cores", "2", *judge], workdir, check=False)
    assert out.returncode != 0 and "reward.judge_endpoint" in out.stdout + out.stderr, out.stdout[-3000:]
    assert {p: p.stat().st_mtime_ns for p in made} == made
    out = run(["snakemake", "-n"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]


def test_an_edited_evalkit_file_is_refused_with_both_digests_before_any_job_that_reads_it(demo, workdir):
    """Last: it leaves the checkout's EvalKit edited. Nothing complete reruns for it (nothing was made with the
    edited copy): a run says it when it reads the workflow; a job that must read it is refused when the run starts,
    once, with both digests, and the fingerprint of the pinned checkout is kept."""
    kit = workdir / "src/videogrpo/demo/stand_in_evalkit/vbvr_bench/evaluators/synthetic.py"
    kit.write_text(kit.read_text() + "\n# an innocent-looking edit\n")
    pinned = re.search(r"digest: ([0-9a-f]{64})", (workdir / "config/config.yaml").read_text()).group(1)
    plain = run(["snakemake", "--cores", "2"], workdir)
    assert (
        "Nothing to be done" in plain.stdout + plain.stderr and "warning: " in plain.stderr and pinned in plain.stderr
    )
    out = run(["snakemake", "--cores", "2", "--forcerun", "fingerprint_evalkit"], workdir, check=False)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    (refused,) = [line for line in text.splitlines() if line.startswith("  - ") and "EvalKit source digest" in line]
    assert STOPPED in text and refused.startswith("  - check_scorer_runtime, fingerprint_evalkit, "), refused
    assert f"expected {pinned} (evalkit.digest)" in text
    assert re.search(r"found    [0-9a-f]{64}", text)
    assert len(list(workdir.glob("results/evalkit/*/fingerprint.json"))) == 1
