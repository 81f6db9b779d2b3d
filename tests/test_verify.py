"""`videogrpo verify` re-checks the external inputs a run pinned: the EvalKit checkout, the judge's rubric and
protocol files, an external evaluation tree. A hand-built run: the real fingerprint_evalkit and eval_set stages
(their manifests as the workflow writes them) and the run's own manifests naming them upstream."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from videogrpo import cli
from videogrpo.demo.synthetic_eval_tree import write_synthetic_tree
from videogrpo.errors import DigestMismatch
from videogrpo.evaluation.evalset import load_samples, recheck_samples
from videogrpo.provenance.digest import evalkit_source_digest, sha256_file, tree_digest
from videogrpo.provenance.manifest import StageRun
from videogrpo.provenance.verify import verify_run

from conftest import TASKS

RUBRIC = 'EVAL_PROMPTS = {"S-1_move_red_square_data-generator": "Score it.\\nOutput format (exactly these lines):"}\n'
PROTOCOL = 'TASK_VLM_JUDGE_OUTPUT_REMINDER = "reminder"\nTASK_VLM_JUDGE_REPAIR_PROMPT = "repair"\n'


def edit_keeping_mtime(path: Path, data: bytes) -> None:
    """An edit Snakemake cannot see: the file's times restored."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def stage(*argv: str) -> None:
    assert cli.main(["stage", *argv]) == 0


def make_run(root: Path, evalkit: Path, tree: Path, kind: str) -> dict[str, Path]:
    """A run with reward.kind `kind` whose evaluation scored with an EvalKit copy and whose matrix read the
    external tree at `tree`; the judge files exist whatever the kind."""
    kit = Path(shutil.copytree(evalkit, root / "evalkit", ignore=shutil.ignore_patterns("__pycache__")))
    judge = root / "judge"
    judge.mkdir()
    (judge / "eval_prompts.py").write_text(RUBRIC)
    (judge / "vbvr_vlm_protocol.py").write_text(PROTOCOL)
    records = root / "results"
    kit_config = {"evalkit": {"path": str(kit), "digest": evalkit_source_digest(kit)}}
    stage(
        "fingerprint-evalkit",
        "--config-json",
        json.dumps(kit_config),
        "--out",
        str(records / "evalkit/fingerprint.json"),
        "--manifest",
        str(records / "evalkit/fingerprint_evalkit.manifest.json"),
    )
    matrix = {"eval_set": str(tree), "eval_set_digest": tree_digest(tree), "expected_samples": len(TASKS)}
    stage(
        "eval-set",
        "--config-json",
        json.dumps({"matrix": matrix}),
        "--tree",
        str(tree),
        "--samples",
        str(records / "evalset/samples.json"),
        "--final-frames",
        str(records / "evalset/final_frames"),
        "--manifest",
        str(records / "evalset/eval_set.manifest.json"),
    )
    reward = {
        "kind": kind,
        "judge_prompts": str(judge / "eval_prompts.py"),
        "judge_prompts_digest": sha256_file(judge / "eval_prompts.py"),
        "judge_protocol": str(judge / "vbvr_vlm_protocol.py"),
        "judge_protocol_digest": sha256_file(judge / "vbvr_vlm_protocol.py"),
    }
    run = records / "runs/run"
    run.mkdir(parents=True)
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward_mean": 0.5}\n')
    with StageRun(
        "train",
        run / "train.manifest.json",
        inputs={},
        params={"reward": reward, **kit_config},
        upstream=[records / "evalkit/fingerprint_evalkit.manifest.json"],
    ) as s:
        s.output("metrics", metrics)
    with StageRun(
        "matrix",
        run / "matrix.manifest.json",
        inputs={},
        params={},
        upstream=[records / "evalset/eval_set.manifest.json"],
    ):
        pass
    return {"run": run, "kit": kit, "rubric": judge / "eval_prompts.py", "protocol": judge / "vbvr_vlm_protocol.py"}


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evalset") / "tree"
    write_synthetic_tree(root, TASKS, 1, seed=0, frames=9, height=32, width=32, fps=16)
    return root


@pytest.fixture
def layout(tmp_path, evalkit, source_tree) -> dict[str, Path]:
    tree = Path(shutil.copytree(source_tree, tmp_path / "tree"))
    return {**make_run(tmp_path, evalkit, tree, "vbvr_vlm"), "tree": tree}


def problems_after(layout: dict[str, Path], edit) -> list[str]:
    lines: list[str] = []
    assert not verify_run(layout["run"], log=lines.append).problems, lines
    assert cli.main(["verify", str(layout["run"])]) == 0
    edit(layout)
    problems = verify_run(layout["run"], log=lambda line: None).problems
    assert cli.main(["verify", str(layout["run"])]) == 4  # verify's exit code for a changed file
    return problems


def test_an_evalkit_file_edited_with_its_time_kept_is_named_with_both_digests(layout):
    victim = layout["kit"] / "vbvr_bench/evaluators/synthetic.py"
    pinned, before = evalkit_source_digest(layout["kit"]), sha256_file(victim)
    problems = problems_after(layout, lambda _: edit_keeping_mtime(victim, victim.read_bytes() + b"\n# edited\n"))
    found = evalkit_source_digest(layout["kit"])
    assert problems == [
        f"CHANGED {victim} (evalkit.digest): EvalKit source digest pinned {pinned}, found {found}; "
        f"fingerprint_evalkit recorded {before}"
    ]


def test_an_evalkit_file_added_to_the_digested_set_is_named(layout):
    extra = layout["kit"] / "vbvr_bench/evaluators/extra.py"
    problems = problems_after(layout, lambda _: extra.write_text("X = 1\n"))
    assert len(problems) == 1 and problems[0].startswith(f"ADDED   {extra} (evalkit.digest): EvalKit source digest")


@pytest.mark.parametrize("name,field", [("rubric", "judge_prompts_digest"), ("protocol", "judge_protocol_digest")])
def test_an_edited_judge_file_is_named_with_its_field_and_both_digests(layout, name, field):
    victim = layout[name]
    pinned = sha256_file(victim)
    problems = problems_after(layout, lambda _: edit_keeping_mtime(victim, victim.read_bytes().replace(b"e", b"E")))
    assert problems == [f"CHANGED {victim} (reward.{field}): pinned {pinned}, found {sha256_file(victim)}"]


def test_a_missing_rubric_is_named_with_its_pin(layout):
    pinned = sha256_file(layout["rubric"])
    problems = problems_after(layout, lambda lay: lay["rubric"].unlink())
    assert problems == [
        f"MISSING {layout['rubric']} (reward.judge_prompts, pinned by reward.judge_prompts_digest {pinned})"
    ]


def test_an_edited_sample_of_the_external_evaluation_tree_is_named(layout):
    tree = layout["tree"]
    (sample,) = sorted(tree.glob("In-Domain_50/*/00000"))[:1]
    victim = sample / "prompt.txt"
    pinned, before = tree_digest(tree), sha256_file(victim)
    problems = problems_after(layout, lambda _: edit_keeping_mtime(victim, victim.read_bytes() + b" (edited)"))
    samples = layout["run"].parent.parent / "evalset/samples.json"
    assert problems == [
        f"CHANGED {tree}/ (matrix.eval_set_digest): pinned {pinned}, found {tree_digest(tree)}",
        f"CHANGED {victim} (matrix.eval_set sample, SHA-256 recorded in {samples}): recorded {before}, "
        f"found {sha256_file(victim)}",
    ]


def test_an_edited_split_manifest_fails_the_tree_pin(layout):
    manifest = layout["tree"] / "split_manifest.json"
    pinned = tree_digest(layout["tree"])
    problems = problems_after(layout, lambda _: edit_keeping_mtime(manifest, manifest.read_bytes() + b"\n"))
    assert problems == [
        f"CHANGED {layout['tree']}/ (matrix.eval_set_digest): pinned {pinned}, found {tree_digest(layout['tree'])}"
    ]


def test_a_rule_reward_run_does_not_check_judge_files_it_never_read(tmp_path, evalkit, source_tree):
    tree = Path(shutil.copytree(source_tree, tmp_path / "tree"))
    layout = make_run(tmp_path, evalkit, tree, "vbvr_rule")
    layout["rubric"].write_text("EVAL_PROMPTS = {}\n")
    assert not verify_run(layout["run"], log=lambda line: None).problems
    victim = layout["kit"] / "run_evaluation.py"
    pinned, before = evalkit_source_digest(layout["kit"]), sha256_file(victim)
    victim.write_text(victim.read_text() + "\n")
    assert verify_run(layout["run"], log=lambda line: None).problems == [
        f"CHANGED {victim} (evalkit.digest): EvalKit source digest pinned {pinned}, "
        f"found {evalkit_source_digest(layout['kit'])}; fingerprint_evalkit recorded {before}"
    ]


def test_a_sample_edited_while_a_stage_ran_loses_what_was_made_from_it(layout, tmp_path):
    """What generate_cell and score_cell do after they ran: the files they read, checked again."""
    listing = layout["run"].parent.parent / "evalset/samples.json"
    _, samples = load_samples(listing)
    made = {s.name: tmp_path / f"{s.sample_id}.out" for s in samples}
    for path in made.values():
        path.write_text("made")
    recheck_samples(listing, ("prompt.txt",), lambda name: [made[name]])  # nothing changed: all kept
    victim = layout["tree"] / samples[1].name / "prompt.txt"
    edit_keeping_mtime(victim, victim.read_bytes() + b" edited")
    with pytest.raises(
        DigestMismatch, match=rf"{re.escape(str(victim))}: changed since eval_set recorded it .*, found [0-9a-f]{{64}}"
    ):
        recheck_samples(listing, ("prompt.txt",), lambda name: [made[name]])
    assert [name for name, path in made.items() if not path.exists()] == [samples[1].name]


def test_edited_easyocr_weights_are_named_with_the_tree_fingerprint_evalkit_recorded(tmp_path, evalkit, source_tree):
    """The OCR weights are no source file (evalkit.digest does not cover them), yet the evaluators read them:
    verify compares them with the tree digest fingerprint_evalkit recorded."""
    kit = Path(shutil.copytree(evalkit, tmp_path / "ocr-kit", ignore=shutil.ignore_patterns("__pycache__")))
    (kit / "vbvr_bench/ocr.py").write_text("import easyocr\nreader = easyocr.Reader(['en'])\n")
    (kit / "easyocr_models").mkdir()
    (kit / "easyocr_models/english_g2.pth").write_bytes(b"weights")
    tree = Path(shutil.copytree(source_tree, tmp_path / "tree"))
    layout = {**make_run(tmp_path / "run", kit, tree, "vbvr_rule"), "tree": tree}
    weights = layout["kit"] / "easyocr_models/english_g2.pth"
    recorded = tree_digest(weights.parent)
    problems = problems_after(layout, lambda _: edit_keeping_mtime(weights, b"other weights"))
    assert problems == [
        f"CHANGED {weights.parent}/ (the EasyOCR weights the evaluators read, evalkit.easyocr_models): "
        f"fingerprint_evalkit recorded tree {recorded}, found {tree_digest(weights.parent)}"
    ]


def test_diff_with_one_run_says_how_to_make_the_second(tmp_path, capsys):
    """Right after `make demo` there is one run: the README's diff line gets a way forward, not argparse's usage."""
    (tmp_path / "tiny-0123456789ab").mkdir()
    assert cli.main(["diff", str(tmp_path / "tiny-0123456789ab")]) == 2
    err = capsys.readouterr().err
    assert "diff compares two run directories; given 1" in err and "snakemake --cores 2 --config" in err


def run_with(results: Path, run_id: str, stages: dict[str, dict], expected: list[str]) -> Path:
    """A run directory holding the manifests of `stages` (stage -> params), and the workflow's list of the
    manifests it expects (`expected`), as a run that failed after those stages leaves them."""
    run = results / "runs" / run_id
    run.mkdir(parents=True)
    (run / "out.txt").write_text(run_id)
    for name, params in stages.items():
        with StageRun(name, run / f"{name}.manifest.json", inputs={}, params=params) as s:
            s.output("out", run / "out.txt")
    listed = {name: str(run / f"{name}.manifest.json") for name in expected}
    (results / ".stage-config").mkdir(exist_ok=True)
    (results / ".stage-config" / f"{run_id}.stages.json").write_text(json.dumps(listed))
    return run


def test_an_incomplete_run_is_named_with_the_command_that_rebuilds_that_run(tmp_path):
    """A failed run's missing manifests: the command that started that run, not the default run's plain rerun."""
    results = tmp_path / "results"
    run = run_with(results, "tiny-0123456789ab", {"preflight": {}}, ["preflight", "train", "report"])
    extra = tmp_path / "extra.yaml"
    extra.write_text("train:\n  save_steps: 1\n")
    files = [extra, Path("config/config.yaml")]  # Snakemake lists the Snakefile's own file last
    invocation = {
        "configfiles": [{"path": str(path), "sha256": sha256_file(path)} for path in files],
        "config_overrides": {"train": {"lr": "2.0e-4", "max_steps": "2"}, "results": str(results)},
    }
    (results / ".stage-config/tiny-0123456789ab.invocation.json").write_text(json.dumps(invocation))
    command = (
        f"`snakemake --cores <N> --configfile {extra} --config 'train={{lr: 2.0e-4, max_steps: 2}}' "
        f"results={results}` (the invocation that started run tiny-0123456789ab; it rebuilds every stage whose "
        f"manifest is missing)"
    )
    lines: list[str] = []
    problems = verify_run(run, log=lines.append).problems
    assert f"MISSING {run}/train.manifest.json: manifest of stage train missing; rebuild it with {command}" in problems
    assert lines[-1] == (
        f"{run} is incomplete: 1 of its stages have no manifest (train), and it has no report. It failed, was "
        f"interrupted or still runs; `videogrpo verify {run}` lists what is missing; rebuild it with {command}"
    )
    extra.write_text("train:\n  save_steps: 2\n")  # the command would now make another run
    lines.clear()
    verify_run(run, log=lines.append)
    assert f"missing; but {extra} changed since this run started, so the command now makes another run" in lines[-1]


def test_diff_says_a_run_is_incomplete_and_compares_only_the_fields_both_record(tmp_path):
    """A run that stopped before training records the fields of the stages it got to: the train view of the
    other run is not listed field by field against nothing."""
    results = tmp_path / "results"
    done = {"train": {"train": {"lr": 1.0e-4, "max_steps": 4}, "model": {"kind": "ti2v"}}, "report": {}}
    complete = run_with(results, "tiny-aaaaaaaaaaaa", done, ["train", "report"])
    failed = run_with(results, "tiny-bbbbbbbbbbbb", {"preflight": {"train": {"lr": 2.0e-4, "max_steps": 4}}}, [])
    (results / ".stage-config/tiny-bbbbbbbbbbbb.stages.json").write_text(
        json.dumps({name: str(failed / f"{name}.manifest.json") for name in ("preflight", "train", "report")})
    )
    lines: list[str] = []
    from videogrpo.provenance.verify import diff_runs

    assert diff_runs(complete, failed, log=lines.append) == 1
    assert lines[0] == f"run a: {complete}: complete"
    assert lines[1].startswith(f"run b: {failed} is incomplete: 1 of its stages have no manifest (train), and it has")
    assert lines[2] == (
        "config: run b has no train manifest: compared over the 2 fields both runs record (1 recorded by one run "
        "only are left out)"
    )
    assert lines[3:5] == ["config: 1 differ:", "  train.lr (contract): 0.0001  |  0.0002"]
