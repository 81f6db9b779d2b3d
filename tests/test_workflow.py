"""End-to-end: the embedded default through real `make demo` / `snakemake`: the demo, dry runs, the README's
commands, reports. Reruns and failures: test_workflow_reruns.py (the same demo)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import doc_commands
import pytest
from demo import (
    CELLS,
    CHECK_SAMPLER,
    MODELS,
    NEW_RUN_JOBS,
    PROVENANCE_STAGES,
    RULES,
    SAMPLERS,
    SECRETS,
    VENV,
    first_run_id,
    jobs_run,
    run,
)

from harness import assert_check_shows_csv, assert_table_shows_csv, report_tables

pytestmark = pytest.mark.e2e


def test_dry_run_lists_every_stage(demo):
    dry, _ = demo
    assert set(RULES) | {"all"} == set(jobs_run(dry.stdout + dry.stderr))


def results_state(workdir: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(workdir)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted((workdir / "results").rglob("*"))
        if p.is_file()
    }


def test_a_dry_run_changes_nothing_on_disk(demo, workdir, tmp_path):
    """Byte for byte and by mtimes, after the demo: a changed execution field, a changed contract field, a new
    config file, a recipe. Reading the workflow writes nothing; a real run's onstart does (the fresh checkout's
    dry run, before `make demo`, made no results/ at all: conftest's demo fixture asserts it)."""
    run(["snakemake", "--cores", "2"], workdir)  # up to date first
    before = results_state(workdir)
    extra = tmp_path / "extra.yaml"
    extra.write_text("train:\n  lr: 3.0e-4\n")
    for argv in (
        ["--config", "parallel={master_port: 29871}", "evalkit={workers: 2}"],
        ["--config", "train={lr: 2.0e-4}"],
        ["--configfile", "config/config.yaml", str(extra)],
        ["--configfile", "config/recipes/rl_5b_cps.yaml"],
    ):
        out = run(["snakemake", "-n", *argv], workdir)
        assert "This was a dry-run" in out.stdout + out.stderr or "Nothing to be done" in out.stdout + out.stderr
        assert results_state(workdir) == before, argv
    # On a read-only results tree (mounted read-only in a mount namespace of its own: root passes permission bits),
    # a dry run reads only, so it runs and warns; a run stops before its first job, naming the field and the fix.
    readonly = "mount --bind -o ro results results && exec " if shutil.which("unshare") else None
    if readonly is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a read-only mount")
    for argv in (["-n"], ["-n", "--config", "train={lr: 2.0e-4}"]):
        out = run(["unshare", "-m", "sh", "-c", readonly + shlex.join(["snakemake", *argv])], workdir)
        text = out.stdout + out.stderr
        assert "results is not writable" in text and ("Nothing to be done" in text or "This was a dry-run" in text)
    out = run(
        ["unshare", "-m", "sh", "-c", readonly + "snakemake --cores 1 --config 'train={lr: 2.0e-4}'"],
        workdir,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "results = 'results': cannot write results (results is not writable)" in text
    assert "Traceback" not in text and "Finished jobid" not in text
    assert results_state(workdir) == before


def test_a_driver_inside_a_slurm_allocation_runs_to_its_report(demo, workdir):
    """A driver started inside an `sbatch` or `salloc` allocation has SLURM_JOB_ID in its environment: it is still
    the driver (Snakemake's onstart tells, not the environment), so it records its invocation, which the report
    shows."""
    invocation = workdir / "results/.stage-config/invocation.json"
    invocation.unlink()
    out = run(
        ["snakemake", "--cores", "2", "--forcerun", "report", "--config", "train={lr: 1.0e-4}"],
        workdir,
        SLURM_JOB_ID="4242",
    )
    assert jobs_run(out.stdout + out.stderr) == {"report": 1, "all": 1}
    recorded = json.loads(invocation.read_text())
    assert recorded["config_overrides"] == {"train": {"lr": "1.0e-4"}}  # as given on the command line
    provenance = json.loads(next(workdir.glob("results/runs/*/report/provenance.json")).read_text())
    assert provenance["invocation"] == recorded
    # No SLURM job here: the report's manifest keeps the claim unconfirmed, names no job and bills no allocation;
    # the trace and the cost table list it as run outside SLURM.
    run_dir = next(workdir.glob("results/runs/*/report")).parent
    manifest = json.loads((run_dir / "report.manifest.json").read_text())
    assert manifest["slurm_job_id"] is None and manifest["slurm_job"]["claimed"] == "4242"
    assert not manifest["slurm_job"]["confirmed"] and "SLURM allocation" not in manifest["cost"]["gpus_from"]
    lines = run(["videogrpo", "trace", str(run_dir)], workdir).stdout.splitlines()
    assert "4242" not in "\n".join(lines) and {line.split("\t")[1] for line in lines[1:]} == {"-"}


def test_make_demo_prints_the_report_and_every_output_has_a_manifest(demo, workdir):
    _, made = demo
    report = Path(re.search(r"^report: (\S+)$", made.stdout, re.M).group(1))
    page = report.read_text()
    assert report.is_file() and "Reward during training" in page and "<video src='../../../matrix/" in page
    # The held-out check: the per-task table's rows of base and trained under the training sampler.
    with open(report.parent.parent / "matrix/per_task.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["sampler"] == CHECK_SAMPLER]
    assert [(r["model"], r["task"]) for r in rows[-2:]] == [("base", "ALL"), ("trained", "ALL")]
    (shown,) = [t for t in report_tables(page) if t[0][:2] == ["task", "samples"]]
    assert_check_shows_csv(shown, rows)
    manifests = sorted(workdir.glob("results/**/*.manifest.json"))
    per_cell = {"generate_cell": len(CELLS), "score_cell": len(CELLS)}
    assert sorted(json.loads(m.read_text())["stage"] for m in manifests) == sorted(
        rule for rule in RULES for _ in range(per_cell.get(rule, 1))
    )
    for path in manifests:
        manifest = json.loads(path.read_text())
        for name, record in manifest["outputs"].items():
            digest = record.get("sha256") or record["tree_sha256"]
            assert re.fullmatch(r"[0-9a-f]{64}", digest), (path, name)
            assert Path(workdir, record["path"]).exists(), (path, name)
            if record["kind"] == "directory":
                assert record["entries"] and all(
                    re.fullmatch(r"[0-9a-f]{64}", sha) for sha, _ in record["entries"].values()
                )
    # The DAG is the stages' (the default target `all` runs nothing): no job checks another's inputs.
    assert set(jobs_run(made.stdout + made.stderr)) == {*RULES, "all"}
    # A first-time user sees the stages go by, training's progress and the report's path, not every job's files.
    said = made.stdout + made.stderr
    assert said.count("Finished jobid") == len(RULES) + 2 * (len(CELLS) - 1) + 1 and "[train] step 4/4" in said
    assert "reason:" not in said and "localrule all" not in said and len(said.splitlines()) < 250, len(said)
    private = [p for p in (workdir / "results").rglob("*") if not p.stat().st_mode & 0o040]
    assert not private, f"not readable by the group sharing results/: {private[:5]}"
    provenance = json.loads(next(workdir.glob("results/runs/*/report/provenance.json")).read_text())
    assert set(provenance["stages"]) == PROVENANCE_STAGES
    assert provenance["topology"]["nnodes"] == 1 and provenance["topology"]["nproc"] == 2
    assert provenance["git"]["commit"] is None  # the copy is not a git checkout
    assert all(m["git"] is None for m in provenance["stages"].values())  # recorded by each stage when it ran
    invocation = provenance["invocation"]
    assert [f["path"] for f in invocation["configfiles"]] == ["config/config.yaml"]
    assert (
        invocation["configfiles"][0]["sha256"]
        == __import__("hashlib").sha256((workdir / "config/config.yaml").read_bytes()).hexdigest()
    )
    train = provenance["stages"]["train"]
    final = train["summary"]["final_checkpoint"]
    assert final["loads"] and final["finite"] and final["parameters"] > 0
    assert final["tree_sha256"] == train["outputs"]["final"]["tree_sha256"]
    assert train["accelerator"]["torch"] and train["accelerator"]["cuda_available"] is False
    assert provenance["stages"]["fingerprint_evalkit"]["accelerator"] is None  # light stages never import torch
    crate = json.loads(next(workdir.glob("results/runs/*/ro-crate-metadata.json")).read_text())
    graph = {entity["@id"]: entity for entity in crate["@graph"]}
    actions = {e["name"]: e for e in graph.values() if e.get("@type") == "CreateAction"}
    assert set(actions) == PROVENANCE_STAGES
    final = graph[actions["train"]["result"][0]["@id"]]  # a data entity of the run directory
    assert final["@id"] == "train/final/" and final["sha256"] == train["outputs"]["final"]["tree_sha256"]
    model = graph[actions["fetch_model"]["result"][0]["@id"]]  # a shared download, named by its path
    assert (
        model["name"].startswith("results/models/")
        and model["sha256"] == (provenance["stages"]["fetch_model"]["outputs"]["model"]["tree_sha256"])
    )


def test_the_demo_evaluates_the_matrix_of_two_models_by_two_samplers(demo, workdir):
    """On the evaluation set built from the held-out samples (all tasks trained: In-Domain_50), each cell once, the
    held-out check (flowcps-0.7) among them: per task, trained against base, paired."""
    run_dir = workdir / "results/runs" / first_run_id(workdir)
    with open(run_dir / "matrix/matrix.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    domains = ["In-Domain_50", "overall"]
    assert [(r["model"], r["sampler"], r["domain"]) for r in rows] == [
        (m, s, d) for m in MODELS for s in SAMPLERS for d in domains
    ]
    assert {r["samples"] for r in rows if r["domain"] == "overall"} == {"6"}
    assert all(r["delta_vs_base"] for r in rows if r["model"] == "trained")
    assert not any(r["delta_vs_base"] for r in rows if r["model"] == "base")
    page = (run_dir / "report/report.html").read_text()
    assert "Evaluation matrix" in page and "alt='evaluation matrix'" in page
    tables = report_tables(page)
    (pivot,) = [t for t in tables if t[0] == ["model", *SAMPLERS]]
    assert [row[0] for row in pivot[1:]] == MODELS
    overall = {(r["model"], r["sampler"]): r for r in rows if r["domain"] == "overall"}
    for row in pivot[1:]:
        for sampler, shown in zip(SAMPLERS, row[1:]):
            cell = overall[(row[0], sampler)]
            assert shown == f"{float(cell['mean']):.3f} [{float(cell['ci_low']):.3f}, {float(cell['ci_high']):.3f}]"
    (full,) = [t for t in tables if t[0][:4] == ["model", "sampler", "domain", "samples"]]
    assert_table_shows_csv(full, rows)
    # Each cell's scores are the exact evaluation set, and the matrix is what the cells scored.
    (cells,) = workdir.glob("results/matrix/*")
    for row in overall.values():
        model_dir = "base-" if row["model"] == "base" else first_run_id(workdir)
        (scores,) = [p for p in cells.glob(f"*/{row['sampler']}/scores.csv") if p.parts[-3].startswith(model_dir)]
        with open(scores, newline="") as f:
            scored = [float(r["score"]) for r in csv.DictReader(f)]
        assert len(scored) == 6 and abs(sum(scored) / 6 - float(row["mean"])) < 1e-12
    (evalset,) = workdir.glob("results/evalsets/*/samples.json")
    heldout = json.loads(next(workdir.glob("results/data/*/materialized/splits.json")).read_text())
    listed = json.loads(evalset.read_text())["samples"]
    assert sorted(s["sample_id"] for s in listed) == sorted(i for task in heldout for i in task["heldout"])
    with open(run_dir / "matrix/per_task.csv", newline="") as f:
        check = [r for r in csv.DictReader(f) if r["sampler"] == CHECK_SAMPLER]
    tasks = sorted({s["task"] for s in listed})
    assert [(r["task"], r["model"]) for r in check] == [(t, m) for t in [*tasks, "ALL"] for m in MODELS]
    for base, trained in zip(check[::2], check[1::2]):
        assert float(trained["delta_vs_base"]) == pytest.approx(float(trained["mean"]) - float(base["mean"]))
        assert base["se"] and not base["delta_vs_base"]


def test_a_changed_sampler_or_generation_setting_reruns_only_matrix_cells(demo, workdir):
    run(["snakemake", "--cores", "2"], workdir)  # up to date first
    out = run(["snakemake", "matrix", "--cores", "2"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr  # the demo made every cell
    out = run(["snakemake", "-n", "--config", "matrix={samplers: [unipc, flowcps-0.3]}"], workdir)
    assert jobs_run(out.stdout + out.stderr) == {
        "generate_cell": 2,
        "score_cell": 2,
        "matrix": 1,
        "report": 1,
        "all": 1,
    }
    out = run(["snakemake", "-n", "--config", "matrix={num_frames: 9}"], workdir)  # a shape of the matrix's own
    text = out.stdout + out.stderr
    assert jobs_run(text) == {"generate_cell": len(CELLS), "score_cell": len(CELLS), "matrix": 1, "report": 1, "all": 1}
    assert f"results/runs/{first_run_id(workdir)}/report" in text  # evaluation settings: the same run
    out = run(["snakemake", "-n", "matrix"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr


def test_the_published_checkpoint_matrix_as_a_dry_run_downloads_nothing(demo, workdir, repo):
    """The documented command for the published TI2V-5B checkpoints: 2 models x 6 samplers listed, no training."""
    readme = (repo / "docs/evaluation-matrix.md").read_text()
    (command,) = re.findall(r"^(snakemake -n matrix .*published_5b.*)$", readme, re.M)
    env = {"EVAL_SET": "/data/VBVR-Pro-Eval", "EVAL_DIGEST": "ab" * 32}

    def written() -> list[Path]:  # what stages made (a dry run writes the stage config files only)
        return sorted(
            p.relative_to(workdir) for p in (workdir / "results").rglob("*") if ".stage-config" not in p.parts
        )

    before = written()
    out = run(["bash", "-c", command], workdir, **env)
    text = out.stdout + out.stderr
    jobs = jobs_run(text)
    training = {"fetch_model", "fetch_dataset", "materialize_dataset", "validate_dataset", "preflight", "train"}
    assert {job: n for job, n in jobs.items() if job not in training} == {
        "fetch_eval_model": 2,
        "fetch_kernel": 1,  # generate_cell loads the recipe's FlashAttention-3 kernel offline
        "eval_set": 1,
        "fingerprint_evalkit": 1,
        "check_scorer_runtime": 1,
        "generate_cell": 14,  # 2 models x 6 samplers, and the run's check pair
        "score_cell": 14,
        "matrix": 1,
    }
    for sampler in ("flowcps-0.1", "flowcps-0.3", "flowcps-0.7", "flowcps-0.9", "euler", "unipc"):
        for model in ("rule_rl@003373efcbc3", "judge_rl@1282a14cf537"):
            assert f"/{model}/{sampler}/scores.csv" in text
    assert "results/matrix/evalset-abababababab-gen-" in text
    # The run's own held-out check, as in every run: its trained and base model under the training sampler, on
    # the same (external) evaluation set, which needs the run trained.
    assert "/flowcps-0.7/scores.csv" in text and training <= set(jobs)
    assert written() == before
    # The README's second form: this run's trained model and its base, through the SLURM profile (dry run).
    (command,) = re.findall(r"^(snakemake --profile profiles/slurm matrix .*release.yaml.*)$", readme, re.M)
    out = run(["bash", "-c", command.replace("snakemake ", "snakemake -n ", 1)], workdir, **env)
    text = out.stdout + out.stderr
    jobs = jobs_run(text)
    assert jobs["generate_cell"] == 12 and jobs["score_cell"] == 12 and jobs["train"] == 1  # the check: flowcps-0.7
    generate = resources_of(text, "generate_cell")
    assert generate["tasks_per_gpu"] == "0"  # never --ntasks-per-gpu (the workflow sets it)
    assert (generate["nodes"], generate["gres"]) == ("1", "gpu:8")  # matrix.procs: one process per GPU


def test_secrets_reach_no_file_under_results_or_snakemake(demo, workdir):
    leaked = []
    for root in ("results", ".snakemake"):
        for path in (workdir / root).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                leaked += [f"{path} holds ${name}" for name, value in SECRETS.items() if value.encode() in data]
    assert not leaked, leaked


def test_training_ran_two_processes_and_logged_metrics(demo, workdir):
    log = next(workdir.glob("results/runs/*/logs/train.log")).read_text()
    assert "[rank 0/2]" in log and "[rank 1/2]" in log
    metrics = [
        json.loads(line) for line in next(workdir.glob("results/runs/*/train/metrics.jsonl")).read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert 0 <= m["reward_mean"] <= 1 and m["ppo_ratio_mean"] == 1.0
        assert {
            "policy_loss",
            "kl_loss",
            "reward_std",
            "advantage_mean",
            "ppo_clip_fraction",
            "ppo_approx_kl",
            "grad_norm",
            "learning_rate",
            "delayed_replay_staleness",
            "time_rollout_s",
        } <= set(m)
    assert list(workdir.glob("results/runs/*/wandb/offline-run-*"))
    assert list(workdir.glob("results/runs/*/checkpoints/step-00000004/COMPLETE"))


def test_preflight_prints_the_memory_plan_and_records_it(demo, workdir):
    log = next(workdir.glob("results/runs/*/logs/preflight.log")).read_text()
    assert "[ok] memory_plan:" in log and "not enforced on CPU" in log and "\n    activations" in log
    plan = json.loads(next(workdir.glob("results/runs/*/preflight.json")).read_text())["memory_plan"]
    assert plan["enforced"] is False and plan["peak_bytes"] == max(plan["rollout_bytes"], plan["replay_bytes"]) > 0


def test_second_run_has_nothing_to_do(demo, workdir):
    out = run(["snakemake", "--cores", "2"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr


def test_forcerun_matrix_reruns_only_matrix_and_report(demo, workdir):
    out = run(["snakemake", "--forcerun", "matrix"], workdir)
    assert jobs_run(out.stdout + out.stderr) == {"matrix": 1, "report": 1, "all": 1}


def test_an_override_from_the_readme_makes_a_new_run(demo, workdir):
    before = {p.name for p in (workdir / "results/runs").iterdir()}
    out = run(["snakemake", "--cores", "2", "--config", "train={lr: 2.0e-4, max_steps: 2}"], workdir)
    assert jobs_run(out.stdout + out.stderr) == NEW_RUN_JOBS
    (new,) = {p.name for p in (workdir / "results/runs").iterdir()} - before
    assert len((workdir / "results/runs" / new / "train/metrics.jsonl").read_text().splitlines()) == 2


def test_the_tiny_default_with_lora_and_validation_runs_to_its_report(demo, workdir):
    """docs/options.md's command: LoRA adapters (rank 4) with validation before training and every 2 updates, end
    to end through snakemake. The export is the adapters alone, which the matrix scores like any trained model."""
    before = {p.name for p in (workdir / "results/runs").iterdir()}
    overrides = "train={lora_rank: 4, validate_every: 2, validate_before_training: true}"
    out = run(["snakemake", "--cores", "2", "--config", overrides], workdir)
    assert jobs_run(out.stdout + out.stderr) == NEW_RUN_JOBS
    (new,) = {p.name for p in (workdir / "results/runs").iterdir()} - before
    run_dir = workdir / "results/runs" / new
    final = run_dir / "train/final/transformer"
    assert sorted(p.name for p in final.iterdir()) == ["pytorch_lora_weights.safetensors"]
    state = json.loads((run_dir / "train/final/training_state.json").read_text())
    adapters = (final / "pytorch_lora_weights.safetensors").stat().st_size
    demo_run = workdir / "results/runs" / first_run_id(workdir)
    full = (demo_run / "train/final/transformer/diffusion_pytorch_model.safetensors").stat().st_size
    print(
        f"LORA trainable {state['layout']['trainable_numel']:,} of "
        f"{state['layout']['trainable_numel'] + state['layout']['frozen_numel']:,} parameters; "
        f"adapters {adapters:,} B against the full export's {full:,} B"
    )
    assert state["layout"]["trainable_numel"] == 8448 and adapters < full / 5
    rows = [json.loads(line) for line in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 2, 4]
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2, 3, 4]
    page = (run_dir / "report/report.html").read_text()
    assert "options train.lora_rank = 4, train.validate_every = 2, train.validate_before_training = true" in page
    assert "Validation during training" in page
    cells = {row["model"] for row in csv.DictReader((run_dir / "matrix/matrix.csv").open())}
    assert cells == {"base", "trained"}


def test_cli_commands_of_the_readme(demo, workdir):
    out = run(["videogrpo", "--help"], workdir)
    shown = re.findall(r"^    (\S+)", out.stdout, re.M)  # what a person runs; the rules' commands under `stage`
    commands = ["config", "simulate", "plan", "schema", "verify", "diff", "compare", "trace", "check-storage", "stage"]
    assert shown == commands, out.stdout
    out = run(["videogrpo", "stage", "--help"], workdir)
    for rule in RULES:
        assert rule.replace("_", "-") in out.stdout
    out = run(["videogrpo", "config", "--configfile", "config/config.yaml", "config/recipes/rl_5b_cps.yaml"], workdir)
    assert out.stdout.startswith("# run identity: rl_5b_cps-") and "world size 128" in out.stdout
    out = run(["videogrpo", "config", "--set", "train.lr=2e-4", "train.max_steps=2"], workdir)
    assert out.stdout.startswith("# the same overrides for snakemake: --config 'train={lr: 2e-4, max_steps: 2}'")
    ident = re.search(r"^# run identity: (\S+)", out.stdout, re.M).group(1)
    assert (workdir / "results/runs" / ident).is_dir()  # the run the README's --config override made
    # The same run named with the same --config as snakemake's (docs/options.md); no option is taken by a prefix.
    out = run(["videogrpo", "config", "--run-id", "--config", "train={lr: 2e-4, max_steps: 2}"], workdir)
    assert out.stdout.strip() == ident
    out = run(["videogrpo", "config", "--conf", "train={lr: 2e-4}"], workdir, check=False)
    assert out.returncode == 2 and "unrecognized arguments: --conf" in out.stderr


def trace_of(workdir: Path, command: list[str]) -> list[dict[str, str]]:
    """`videogrpo trace`'s TSV as rows of its columns."""
    lines = run(command, workdir).stdout.splitlines()
    header = lines[0].split("\t")
    assert header == ["name", "job_id", "state", "host", "start", "end", "wall_s", "cpu_h", "gpus", "gpu_h"]
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def test_the_trace_is_every_job_of_the_run_with_what_its_manifest_says_it_cost(demo, workdir):
    run(["snakemake", "--cores", "2"], workdir)  # up to date, the report included
    run_id = first_run_id(workdir)
    rows = trace_of(workdir, ["bash", "-c", "videogrpo trace results/runs/$(videogrpo config --run-id)"])
    listed = json.loads((workdir / f"results/.stage-config/{run_id}.stages.json").read_text())
    assert [r["name"] for r in rows] != sorted(r["name"] for r in rows)  # by start, not by name
    assert {r["name"] for r in rows} == PROVENANCE_STAGES | {"report"} == set(listed)
    assert [r["start"] for r in rows] == sorted(r["start"] for r in rows)
    for row in rows:
        manifest = json.loads((workdir / listed[row["name"]]).read_text())
        cost = manifest["cost"]
        assert row == {
            "name": row["name"],
            "job_id": "-",  # the demo ran outside SLURM
            "state": "COMPLETED",
            "host": manifest["host"],
            "start": manifest["started_at"],
            "end": manifest["ended_at"],
            "wall_s": row["wall_s"],
            "cpu_h": row["cpu_h"],
            "gpus": "0",
            "gpu_h": "0",
        }, row
        assert float(row["wall_s"]) == cost["wall_s"] == manifest["duration_s"] > 0
        assert float(row["cpu_h"]) == pytest.approx(cost["cpu_s"] / 3600, abs=1e-6) and cost["cpu_s"] > 0
        assert (cost["gpus"], cost["gpu_h"], cost["nodes"], cost["state"]) == (0, 0, 1, "COMPLETED")
    train = json.loads((workdir / listed["train"]).read_text())["cost"]
    assert train["gpus_from"] == "parallel.device = cpu: no GPU" and train["nodes"] == 1
    # The stage's own process waits on torchrun: most of its CPU time is the two ranks', its waited-for children.
    assert train["cpu_children_s"] > train["cpu_s"] - train["cpu_children_s"], train
    help_text = run(["videogrpo", "trace", "--help"], workdir).stdout
    assert "--no-sacct" in help_text and "gpu_h" in help_text


def resources_of(dry_run: str, rule: str) -> dict[str, str]:
    block = dry_run.split(f"rule {rule}:")[1].split("\nrule ")[0]
    line = re.search(r"^\s+resources: (.*)$", block, re.M).group(1)
    return dict(item.split("=", 1) for item in line.split(", "))


def test_the_readme_slurm_commands_as_dry_runs_with_resources_that_fit_each_stage(demo, workdir, repo):
    """The SLURM block of docs/slurm.md (the README's two lines among them) run as dry runs (-n) here: every job
    sized by the profile, GPUs and nodes by the recipe."""
    readme = (repo / "docs/slurm.md").read_text()
    block = re.search(r"```sh\n(snakemake -n --profile profiles/slurm.*?)```", readme, re.S).group(1)
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 4
    by_name = commands[-1].split()
    assert by_name[:4] == ["snakemake", "-n", "--profile", "slurm"]
    # As typed on a fresh clone: the checkout's `slurm` link, no profile installed anywhere.
    out = run(by_name, workdir, XDG_CONFIG_HOME=str(workdir / "no-profiles-here"))
    assert "Using profiles slurm" in out.stdout + out.stderr and "train" in jobs_run(out.stdout + out.stderr)
    run(["make", "profile"], workdir, XDG_CONFIG_HOME=str(workdir / "xdg"))  # for --profile slurm from elsewhere
    assert (workdir / "xdg/snakemake/slurm/config.yaml").is_file()
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    from_elsewhere = [str(workdir / arg) if arg.endswith(".yaml") else arg for arg in by_name]
    from_elsewhere += ["--snakefile", str(workdir / "Snakefile"), "--directory", str(workdir)]
    out = run(from_elsewhere, elsewhere, XDG_CONFIG_HOME=str(workdir / "xdg"))
    assert "train" in jobs_run(out.stdout + out.stderr)
    for command in commands:
        argv = command.split()
        if "-n" not in argv:
            argv.insert(1, "-n")
        out = run(argv, workdir, XDG_CONFIG_HOME=str(workdir / "xdg"))
        text = out.stdout + out.stderr
        assert set(jobs_run(text)) >= {"preflight", "train", "generate_cell"}
    train, preflight, generate = (resources_of(text, rule) for rule in ("train", "preflight", "generate_cell"))
    assert (train["nodes"], train["gres"], train["mem_mb"], train["cpus_per_task"]) == ("16", "gpu:8", "512000", "64")
    for stage, minutes in ((preflight, "30"), (generate, "600")):  # a cell: matrix.procs (1) GPUs
        assert (stage["nodes"], stage["gres"], stage["mem_mb"], stage["cpus_per_task"], stage["runtime"]) == (
            "1",
            "gpu:1",
            "64000",
            "16",
            minutes,
        )
    assert "mpi" in train and "mpi" not in generate
    assert train["tasks_per_gpu"] == preflight["tasks_per_gpu"] == generate["tasks_per_gpu"] == "0"


def test_manual_two_machine_launch_equals_the_local_run(demo, workdir):
    """The launch contract by hand: two "machines" (one process each) on this host, with the README's commands:
    machine 0 runs the workflow, machine 1 the training command the dry run prints."""
    import socket

    (workdir / "my.yaml").write_text("parallel:\n  nodes: 2\n  procs_per_node: 1\n")
    printed = run(
        ["bash", "-c", "snakemake -n -p train --configfile my.yaml | sed -n 's/^Shell command: //p'"], workdir
    )
    (command,) = [line.strip() for line in printed.stdout.splitlines() if line.startswith("videogrpo stage train")]
    command = command.split(" 2>&1 | ")[0]  # machine 1 logs to its own terminal, not to machine 0's log file
    config_file = workdir / re.search(r"--config-json '?@(\S+?)'? ", command).group(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    contract = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    env = dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", WANDB_MODE="offline", **contract)
    # Machine 0 first: its run writes each stage's config file when it starts (the dry run above wrote nothing).
    machine0_argv = ["snakemake", "--cores", "all", "--configfile", "my.yaml"]
    machine0 = subprocess.Popen(
        machine0_argv, cwd=workdir, env=dict(env, RANK="0"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    machine1 = None
    try:
        deadline = time.monotonic() + 120
        while not config_file.is_file():
            assert machine0.poll() is None and time.monotonic() < deadline, "machine 0 wrote no config file"
            time.sleep(0.2)
        machine1 = subprocess.Popen(
            ["bash", "-c", command],
            cwd=workdir,
            env=dict(env, RANK="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output, _ = machine1.communicate(timeout=300)
        first, _ = machine0.communicate(timeout=600)
    finally:
        for machine in (machine0, machine1):
            if machine is not None and machine.poll() is None:
                machine.kill()
    doc_commands.record(machine0_argv, machine0.returncode, dict(contract, RANK="0"))
    doc_commands.record(["bash", "-c", command], machine1.returncode, dict(contract, RANK="1"))
    assert machine0.returncode == 0, first[-3000:]
    assert machine1.returncode == 0, output
    assert "[launch] node 1/2" in output and "(manual)" in output
    runs = sorted(workdir.glob("results/runs/*/train.manifest.json"), key=lambda p: p.stat().st_mtime)
    manual = json.loads(runs[-1].read_text())
    assert manual["summary"]["launch"] == {"nnodes": 2, "nproc": 1, "slurm": False}
    weights = {
        json.loads(p.read_text())["outputs"]["final"]["entries"]["transformer/diffusion_pytorch_model.safetensors"][0]
        for p in runs
        if json.loads(p.read_text())["summary"]["updates"] == 4
        and not json.loads(p.read_text())["params"]["train"].get("lora_rank")  # the LoRA run exports adapters
    }
    assert len(weights) == 1, "1 machine x 2 processes and 2 machines x 1 process must train the same weights"


def test_verify_rehashes_a_run_and_diff_compares_two(demo, workdir):
    run(["snakemake", "--cores", "2"], workdir)
    run_dir = f"results/runs/{first_run_id(workdir)}"
    out = run(["bash", "-c", "videogrpo verify results/runs/$(videogrpo config --run-id)"], workdir)
    assert re.search(r"\d+ manifests, \d+ files checked, 0 problems", out.stdout + out.stderr)
    (videos,) = workdir.glob(f"results/matrix/*/{first_run_id(workdir)}/{CHECK_SAMPLER}/videos")  # the check's
    (victim,) = sorted(videos.rglob("*.mp4"))[:1]
    good = victim.read_bytes()
    victim.write_bytes(good + b"\0")
    (videos / "stray.txt").write_text("added by hand")
    index = next(workdir.glob("results/data/*/materialized/dataset.json"))
    index_text = index.read_text()
    index.unlink()
    try:
        out = run(["videogrpo", "verify", run_dir], workdir, check=False)
        text = out.stdout + out.stderr
        assert out.returncode == 4
        assert f"CHANGED {victim.relative_to(workdir)} (generate_cell output videos): recorded " in text
        assert f"ADDED   {(videos / 'stray.txt').relative_to(workdir)} (generate_cell output videos)" in text
        assert f"MISSING {index.relative_to(workdir)} (materialize_dataset output dataset.json)" in text
        assert "3 problems" in text
    finally:
        victim.write_bytes(good)
        (videos / "stray.txt").unlink()
        index.write_text(index_text)
    run(["snakemake", "--cores", "2", "--config", "train={lr: 2.0e-4, max_steps: 2}"], workdir)  # the README override
    out = run(["bash", "-c", "videogrpo diff $(ls -d results/runs/tiny-* | head -2)"], workdir, check=False)
    assert out.returncode == 1 and "config: " in out.stdout, out.stdout + out.stderr  # the README's form
    # Which two runs `ls` lists first depends on their hashes: compare the demo and the README override.
    override = run(["videogrpo", "config", "--set", "train.lr=2e-4", "train.max_steps=2", "--run-id"], workdir)
    pair = [run_dir, f"results/runs/{override.stdout.strip()}"]
    out = run(["videogrpo", "diff", *pair], workdir, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "config: 2 differ:" in text  # the two runs differ in lr and max_steps only
    assert re.search(r"train\.lr \(contract\): (0\.0001  \|  0\.0002|0\.0002  \|  0\.0001)", text), text
    assert re.search(r"train\.max_steps \(contract\): (4  \|  2|2  \|  4)", text), text
    assert re.search(r"digests: \d+ differ", text) and "train.final:" in text
    # The cost change, shown and not counted: the totals of the two traces, then each job whose figures differ.
    cost = text.split("cost (run a | run b; times always differ, so not counted as a difference):\n")[1]
    traces = [trace_of(workdir, ["videogrpo", "trace", "--no-sacct", side]) for side in pair]
    walls = [sum(float(r["wall_s"]) for r in rows) for rows in traces]
    cpus = [sum(float(r["cpu_h"]) for r in rows) for rows in traces]
    assert cost.startswith(
        f"  total: wall {walls[0]:.1f} | {walls[1]:.1f} s ({(walls[1] - walls[0]) / walls[0] * 100:+.1f} %), "
        f"CPU {cpus[0]:.4f} | {cpus[1]:.4f} h"
    ), cost
    jobs = [line.split(":")[0].strip() for line in cost.splitlines()[1:]]
    shared = {r["name"] for r in traces[0]} & {r["name"] for r in traces[1]}
    assert {"train", "preflight", "matrix", "report"} <= set(jobs) and "fetch_model" not in jobs, jobs
    assert "fetch_model" in shared  # the same download for both: one manifest, left out


def test_dag_inspection_commands_of_the_readme(demo, workdir):
    run(["make", "graphviz"], workdir)
    run(["snakemake", "--cores", "2"], workdir)  # up to date: nothing changed, nothing listed
    for command, rules in (
        ("snakemake --dag | dot -Tsvg > dag.svg", RULES),
        ("snakemake --rulegraph | dot -Tsvg > rulegraph.svg", RULES),
    ):
        run(["bash", "-o", "pipefail", "-c", command], workdir)
        svg = (workdir / command.split("> ")[1]).read_text()
        assert svg.startswith("<?xml") and all(rule in svg for rule in rules)
    summary = run(["snakemake", "--summary"], workdir).stdout
    assert re.search(r"report/report\.html\t.*\treport\t.*\tok\tno update", summary), summary[-2000:]
    detailed = run(["snakemake", "--detailed-summary"], workdir).stdout
    assert "videogrpo stage report --config-json" in detailed
    for argv in (["snakemake", "--list-changes", "code"], ["snakemake", "--list-changes", "input"]):
        listed = run(argv, workdir).stdout
        assert "results/" not in listed, (argv, listed)
    # Snakemake 9.27.1 lists every output with recorded params under `params`, changed or not (README);
    # the outputs of a stage whose field changed are among them.
    listed = run(["snakemake", "--list-changes", "params"], workdir).stdout
    assert "train.manifest.json" in listed
    out = run(["snakemake", "-n", "--config", "matrix={bootstrap: 100}"], workdir).stdout
    reasons = [line for line in out.splitlines() if "Params have changed" in line]
    # Snakemake prints the changed params as unordered sets: the field and the stage's config file.
    changed = [line.split("before: ", 1)[1].split(" now: ") for line in reasons]
    assert len(changed) >= len(CELLS) and all(  # every score_cell (and the matrix)
        "'matrix.bootstrap=200'" in before and "'matrix.bootstrap=100'" in now for before, now in changed
    )
    assert all(len(line.split("Params have changed", 1)[1]) < 300 for line in reasons)  # the field, not JSON
    out = run(["snakemake", "-n", "--config", "logging={wandb_project: renamed}"], workdir)
    assert "Nothing to be done" in out.stdout + out.stderr  # a cosmetic label reruns nothing


def test_snakemake_report(demo, workdir):
    run(["snakemake", "--report", "report.html"], workdir)
    assert (workdir / "report.html").stat().st_size > 10_000


def test_config_error_names_the_field(demo, workdir):
    out = run(["snakemake", "-n", "--config", "grpo={group_size: 3, prompts_per_step: 1}"], workdir, check=False)
    assert out.returncode != 0
    assert "grpo.group_size = 3: must be a multiple of the 2 ranks sharing each prompt" in out.stdout + out.stderr
    out = run(["snakemake", "-n", "--config", "grpo={sampler: ddim}"], workdir, check=False)
    assert out.returncode != 0
    assert "grpo.sampler = 'ddim': must be one of flowcps, dancegrpo, flowgrpo" in out.stdout + out.stderr
    out = run(["snakemake", "-n", "--config", "data={task_list: no/such/list.txt}"], workdir, check=False)
    assert out.returncode != 0
    assert "data.task_list = 'no/such/list.txt': no such file; point it at a file listing one task" in (
        out.stdout + out.stderr
    )
    (workdir / "not-a-dir").write_text("")  # `results` through a file: nothing can be written, or looked at
    out = run(["snakemake", "-n", "--config", "results=not-a-dir/results"], workdir, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "results = 'not-a-dir/results': cannot write" in text
    assert "point `results` at a writable directory" in text and "Traceback" not in text
    # A config of the time before the held-out check was the matrix's cells: refused naming the field's home.
    out = run(["snakemake", "-n", "--config", "evaluate={split: rl}"], workdir, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Job stats" not in text
    assert "evaluate.split: the `evaluate` section is gone" in text and "set matrix.split" in text


@pytest.mark.parametrize("recipe", ["rl_5b_cps", "rl_5b_sde", "rl_5b_vlm", "rl_a14b_rule"])
def test_recipe_dry_runs_print_their_dag(demo, workdir, recipe):
    out = run(["snakemake", "-n", "--configfile", f"config/recipes/{recipe}.yaml"], workdir)
    jobs = jobs_run(out.stdout + out.stderr)
    # The recipes' matrix holds the held-out check only, until a layer names its models (config/matrix/): the
    # trained and base model under the training sampler, on the first 4 training prompts of each task.
    expected = set(RULES) | {"all"}
    assert jobs["generate_cell"] == jobs["score_cell"] == 2
    check = {"rl_5b_sde": "dancegrpo-0.3", "rl_a14b_rule": "flowcps-uniform-0.0-1.0"}.get(recipe, "flowcps-0.7")
    cells = re.findall(r"^\s+wildcards: model=(\S+), sampler=(\S+)$", out.stdout, re.M)
    assert len(cells) == 4 and {sampler for _, sampler in cells} == {check}  # generated and scored
    assert {model.startswith(f"{recipe}-") for model, _ in cells} == {True, False}  # trained and base
    assert "/evalsets/rl-" in out.stdout
    if recipe != "rl_a14b_rule":  # the 5B recipes' _flash_3_hub; the A14B recipe runs diffusers' SDPA (native)
        expected |= {"fetch_kernel"}
    if recipe == "rl_5b_vlm":  # the judge model trains; the EvalKit scores the evaluation
        # (docs/reference-system.md#evaluation)
        expected = expected | {"fetch_judge"}
        training = run(["snakemake", "-n", "train", "--configfile", f"config/recipes/{recipe}.yaml"], workdir)
        assert set(jobs_run(training.stdout + training.stderr)) == expected - {
            "fingerprint_evalkit",
            "check_scorer_runtime",
            "eval_set",
            "generate_cell",
            "score_cell",
            "matrix",
            "report",
            "all",
        }
    assert set(jobs) == expected
    assert f"results/runs/{recipe}-" in out.stdout + out.stderr
