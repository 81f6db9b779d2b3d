"""The A14B path through real `snakemake` (config/tiny_a14b.yaml): the tiny two-expert I2V model trained on 4 gloo
processes as tensor-parallel 2 x FSDP 2, exported with both experts, run through the matrix (its held-out check
among the cells) and reported;
a plain rerun then has nothing to do."""

from __future__ import annotations

import json
import re

import pytest
from demo import copy_checkout, jobs_run, run

TINY_A14B = ["--configfile", "config/tiny_a14b.yaml"]


@pytest.fixture(scope="module")
def a14b_run(tmp_path_factory):
    checkout = copy_checkout(tmp_path_factory.mktemp("a14b-checkout"))
    out = run(["snakemake", "--cores", "2", *TINY_A14B], checkout)
    (run_dir,) = list((checkout / "results/runs").iterdir())
    return checkout, run_dir, out


def test_the_tiny_a14b_run_trains_both_experts_with_tp_and_fsdp_and_reports(a14b_run):
    checkout, run_dir, out = a14b_run
    jobs = jobs_run(out.stdout + out.stderr)
    assert {"fetch_model", "preflight", "train", "eval_set", "generate_cell", "score_cell", "matrix", "report"} <= set(
        jobs
    )
    assert jobs["generate_cell"] == 4  # base and trained by euler, and by the training's eta range (the check)
    log = (run_dir / "logs/train.log").read_text()
    assert "world size 4" in log and re.search(r"\[rank 3/4\]", log), log[-3000:]
    state = json.loads((run_dir / "train/final/training_state.json").read_text())
    for name in ("high", "low"):
        assert state["layout"][name]["mesh_dims"] == ["dp", "tp"] and state["layout"][name]["mesh_shape"] == [2, 2]
    final = run_dir / "train/final"
    exported = sorted(p.name for p in final.iterdir() if not p.name.startswith("."))  # (Snakemake's timestamp)
    assert exported == ["training_state.json", "transformer", "transformer_2"]
    manifest = json.loads((run_dir / "train.manifest.json").read_text())
    assert manifest["outputs"]["final"]["tree_sha256"]
    metrics = [json.loads(line) for line in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["grad_norm"] > 0 for m in metrics)
    checkpoint_state = json.loads((run_dir / "checkpoints/step-00000002/state.json").read_text())
    assert checkpoint_state["parts"] == ["high", "low"]
    assert (run_dir / "report/report.html").is_file()
    matrix = (run_dir / "matrix/matrix.csv").read_text()
    assert "base" in matrix and "trained" in matrix and "euler" in matrix, matrix
    check = [line for line in (run_dir / "matrix/per_task.csv").read_text().splitlines() if ",ALL," in line]
    assert {line.split(",")[0] for line in check if "flowcps-uniform-0.0-1.0" in line} == {"base", "trained"}


def test_a_plain_rerun_of_the_tiny_a14b_run_has_nothing_to_do(a14b_run):
    checkout, _, _ = a14b_run
    out = run(["snakemake", "-n", "--cores", "2", *TINY_A14B], checkout)
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]
