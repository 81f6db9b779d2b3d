"""The check when a run starts (pipeline/start_check.py, pipeline/start.py): the inputs of every stage job that is
about to run and holds outputs from before, against their upstream manifests and pins, before Snakemake removes an
output; what the workflow writes when a run starts and never while it is read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from videogrpo import config
from videogrpo.errors import DigestMismatch
from videogrpo.pipeline import stage_config, start
from videogrpo.pipeline.start_check import StageJob, check_jobs, jobs_at_risk, raise_on
from videogrpo.provenance.digest import evalkit_source_digest
from videogrpo.provenance.manifest import StageRun


def made_by(stage: str, tmp_path: Path, **outputs: Path) -> Path:
    manifest = tmp_path / f"{stage}.manifest.json"
    with StageRun(stage, manifest, inputs={}) as run:
        for name, path in outputs.items():
            run.output(name, path)
    return manifest


@pytest.fixture
def table(tmp_path) -> tuple[Path, Path, Path]:
    """A matrix table its stage made, and a report made from it: (table, matrix manifest, report output)."""
    made = tmp_path / "per_task.csv"
    made.write_text("a,b\n1,2\n")
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    return made, made_by("matrix", tmp_path, table=made), report


def report_job(table, evalkit=None) -> StageJob:
    made, manifest, report = table
    return StageJob("report", {"table": str(made)}, [str(manifest)], [str(report)], evalkit)


def test_inputs_as_their_stage_made_them_pass_and_an_edit_is_refused_naming_the_file(table, tmp_path, evalkit):
    made = table[0]
    pin = (str(evalkit), evalkit_source_digest(evalkit))
    assert check_jobs([report_job(table, pin)], tmp_path / "digests.json") == (1, [])
    made.write_text("a,b\n1,3\n")
    checked, problems = check_jobs([report_job(table)], None)
    assert checked == 1 and len(problems) == 1
    assert problems[0].startswith(f"report: {made}: input table is not what matrix made")
    with pytest.raises(DigestMismatch, match="the run stopped before it started, and every output is as it was"):
        raise_on(problems)


def test_an_evalkit_off_its_pin_and_a_manifest_cut_short_are_refused(table, evalkit):
    problems = check_jobs([report_job(table, (str(evalkit), "0" * 64))], None)[1]
    assert len(problems) == 1 and "EvalKit source digest mismatch" in problems[0]
    manifest = table[1]
    manifest.write_text(manifest.read_text()[:100])
    (problem,) = check_jobs([report_job(table)], None)[1]
    assert f"`rm {manifest}`, then `snakemake --cores <N>`" in problem


def test_only_jobs_that_hold_outputs_are_checked_and_only_inputs_no_job_of_the_run_remakes(table, tmp_path):
    made, manifest, report = table
    made.write_text("edited")
    report.unlink()  # nothing to lose: the stage checks its inputs itself when it reads them
    assert check_jobs([report_job(table)], None) == (0, [])
    report.write_text("<html></html>")
    remake = StageJob("matrix", {}, [], [str(made), str(manifest)])
    kept = {job.stage: job for job in jobs_at_risk([report_job(table), remake])}
    assert kept["report"].inputs == {} and kept["report"].upstream == []
    assert check_jobs([report_job(table), remake], None)[1] == []  # remade by this run: fresh, not checked


def test_an_evaluation_tree_that_is_gone_is_named_as_missing_not_as_changed(table, tmp_path):
    """eval_set holds outputs and its tree (matrix.eval_set) is not there: a wrong path, not an edited set."""
    missing = tmp_path / "no-such-tree"
    job = StageJob("eval_set", {}, [], [str(table[0])], tree=(str(missing), "ab" * 32))
    (problem,) = check_jobs([job], None)[1]
    assert problem == (
        f"eval_set: matrix.eval_set = {str(missing)!r}: no such directory (the evaluation tree "
        f"matrix.eval_set_digest pins as {'ab' * 32}); point matrix.eval_set at it, or restore it there"
    )


def test_a_directory_is_hashed_once_and_a_restore_with_the_old_times_is_hashed_again(tmp_path):
    """A file unchanged since an earlier check (device, inode, size, both times) is not read again; a write that
    puts the size and modification time back (cp -p, rsync -a) still changes the change time: hashed again."""
    model = tmp_path / "pipeline"
    (model / "transformer").mkdir(parents=True)
    weights = model / "transformer/weights.bin"
    weights.write_bytes(b"w" * 4096)
    manifest = made_by("fetch_model", tmp_path, model=model)
    out = tmp_path / "train.manifest.json"
    out.write_text("{}")
    job = StageJob("train", {"model": str(model)}, [str(manifest)], [str(out)])
    cache = tmp_path / "digests.json"
    assert check_jobs([job], cache) == (1, [])
    recorded = json.loads(cache.read_text())
    assert list(recorded) == [str(weights)] and recorded[str(weights)][0][2] == 4096
    recorded[str(weights)][1] = "f" * 64  # a cached digest is trusted while the file's stat is the same
    cache.write_text(json.dumps(recorded))
    assert "input model is not what fetch_model made" in check_jobs([job], cache)[1][0]
    cache.unlink()
    assert check_jobs([job], cache) == (1, [])
    st = weights.stat()
    weights.write_bytes(b"v" * 4096)  # same size, modification time put back
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_mtime_ns == st.st_mtime_ns and weights.stat().st_size == st.st_size
    assert "files that differ: transformer/weights.bin" in check_jobs([job], cache)[1][0]


def fake_job(rule, output, **inputs):
    named = SimpleNamespace(items=lambda: list(inputs.items()))
    return SimpleNamespace(rule=SimpleNamespace(name=rule), input=named, output=output)


def test_stage_jobs_take_named_inputs_manifests_undeclared_reads_and_pins_of_stage_jobs_only():
    jobs = [
        fake_job("all", []),
        fake_job(
            "train",
            ["r/runs/x/train.manifest.json"],
            model="r/models/m/pipeline",
            fetch_model_manifest="r/models/m/fetch_model.manifest.json",
        ),
        fake_job("fingerprint_evalkit", ["r/evalkit/e/fingerprint.json"], sources=["kit/run_evaluation.py"]),
        fake_job("materialize_dataset", ["r/data/d/m.manifest.json"]),
    ]
    reads = {"train": {"raw": "r/data/d/raw", "materialize_dataset_manifest": "r/data/d/m.manifest.json"}}
    writes = {"materialize_dataset": ["r/data/d/raw"]}
    stages = ["train", "fingerprint_evalkit", "materialize_dataset"]
    found = start.stage_jobs(jobs, stages, reads, writes, {"fingerprint_evalkit"}, ("kit", "a"), {"sources"}, None)
    train, kit, materialize = found
    assert materialize.outputs == ["r/data/d/m.manifest.json", "r/data/d/raw"]
    assert train.inputs == {"model": "r/models/m/pipeline", "raw": "r/data/d/raw"}
    assert train.upstream == ["r/models/m/fetch_model.manifest.json", "r/data/d/m.manifest.json"]
    assert train.evalkit is None and kit.evalkit == ("kit", "a") and kit.inputs == {} and kit.tree is None


def test_a_run_start_writes_the_invocation_the_stage_list_and_the_config_files_with_a_note(tmp_path, capsys):
    cfg = config.load([Path("config/config.yaml")], {})
    manifests = {"train": str(tmp_path / "runs/x/train.manifest.json")}
    start.begin_run(cfg, tmp_path, "x", manifests, ["config/config.yaml"], {"train": {"lr": 1}}, [], False)
    record = json.loads(start.invocation_path(tmp_path).read_text())
    assert record["configfiles"][0]["path"] == "config/config.yaml" and record["config_overrides"]["train"]["lr"] == 1
    assert json.loads((tmp_path / ".stage-config/x.stages.json").read_text()) == manifests
    # Kept per run too: verify and diff name the command that rebuilds this run, whatever run started last.
    assert json.loads((tmp_path / ".stage-config/x.invocation.json").read_text()) == record
    written = stage_config.config_path(tmp_path, cfg, "train")
    assert json.loads(written.read_text()) == json.loads(stage_config.config_text(cfg, "train"))
    assert capsys.readouterr().err == ""
    changed = config.load([Path("config/config.yaml")], {"parallel": {"master_port": 29871}})
    assert stage_config.config_path(tmp_path, changed, "train") == written  # an execution field: the same file
    start.begin_run(changed, tmp_path, "x", manifests, ["config/config.yaml"], {}, [], False)
    assert "note: train: parallel.master_port 29500 -> 29871: how it runs, not what it makes" in capsys.readouterr().err
    assert json.loads(written.read_text())["parallel"]["master_port"] == 29871
    contract = config.load([Path("config/config.yaml")], {"train": {"lr": 2e-4}})
    assert stage_config.config_path(tmp_path, contract, "train") != written  # a param: another file


def test_a_refused_input_at_the_start_of_a_run_raises_before_any_job(table, tmp_path):
    cfg = config.load([Path("config/config.yaml")], {})
    table[0].write_text("edited")
    with pytest.raises(DigestMismatch, match="report: .*per_task.csv: input table is not what matrix made"):
        start.begin_run(cfg, tmp_path, "x", {}, [], {}, [report_job(table)], False)


def test_a_problem_is_said_once_with_every_job_it_stops_and_a_refused_run_writes_nothing(table, tmp_path, evalkit):
    """A wrong EvalKit stops every job that reads it, outputs or not: one line naming them all (not one per job).
    Refused, the run writes no invocation, stage list or config file."""
    made, manifest, report = table
    pin = (str(evalkit), "0" * 64)
    fresh = [StageJob("score_cell", {}, [], [str(tmp_path / f"cell{i}/scores.csv")], pin) for i in range(6)]
    checked, problems = check_jobs([report_job(table, pin), *fresh, StageJob("train", {}, [], [], pin)], None)
    assert checked == 1 and len(problems) == 1, problems
    assert problems[0].startswith("report, score_cell (6 jobs), train: ") and "EvalKit source digest" in problems[0]
    made.write_text("edited")
    second = StageJob("report", {"table": str(made)}, [str(manifest)], [str(report)])
    (problem,) = check_jobs([report_job(table), second], None)[1]
    assert problem.startswith("report (2 jobs): ")
    cfg = config.load([Path("config/config.yaml")], {})
    results = tmp_path / "results"
    with pytest.raises(DigestMismatch):
        start.begin_run(cfg, results, "x", {}, ["config/config.yaml"], {}, [report_job(table, pin)], False)
    assert not results.exists() or not list(results.rglob("*")), list(results.rglob("*"))
