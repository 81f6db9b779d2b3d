"""The end-to-end demo's helpers: a fresh copy of the checkout, `snakemake` and `videogrpo` run in it.

The demo itself (`make demo` in that copy) is a session fixture of conftest.py, shared by the e2e modules
test_workflow*.py: each test brings the demo to the state it needs and leaves it as it found it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import doc_commands

from videogrpo.stages import STAGES

REPO = Path(__file__).resolve().parents[1]

VENV = Path(sys.executable).parent.parent
RULES = [
    "fetch_model",
    "fetch_dataset",
    "materialize_dataset",
    "validate_dataset",
    "fingerprint_evalkit",
    "check_scorer_runtime",
    "preflight",
    "train",
    "eval_set",
    "generate_cell",
    "score_cell",
    "matrix",
    "report",
]
# The tiny default's matrix: base and trained by two samplers, one generate and one score job per cell; the
# training sampler's column (flowcps-0.7) is the held-out check.
MODELS, SAMPLERS = ["base", "trained"], ["unipc", "flowcps-0.7"]
CHECK_SAMPLER = "flowcps-0.7"
CELLS = [f"{model}:{sampler}" for model in MODELS for sampler in SAMPLERS]
# The jobs of a new run of the tiny default: its training, and the trained model's cells (the base model's are shared).
NEW_RUN_JOBS = {
    "preflight": 1,
    "train": 1,
    "generate_cell": len(SAMPLERS),
    "score_cell": len(SAMPLERS),
    "matrix": 1,
    "report": 1,
    "all": 1,
}
# Stages as the report's provenance names them: a cell's stages once per cell.
PROVENANCE_STAGES = {r for r in RULES if r not in ("generate_cell", "score_cell", "report")} | {
    f"{stage}:{cell}" for stage in ("generate_cell", "score_cell") for cell in CELLS
}


def copy_checkout(dest: Path) -> Path:
    """The files of the checkout (tracked and not ignored), with their mtimes, as a fresh clone would have."""
    listed = (
        subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        if (REPO / rel).is_symlink():  # as git checks it out: the link, not what it points at
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(REPO / rel), dest / rel)
        elif (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    return dest


def run(args: list[str], cwd: Path, check: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", WANDB_MODE="offline", **extra_env)
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    doc_commands.record(args, out.returncode, extra_env)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {out.returncode}\n{out.stdout[-6000:]}\n{out.stderr[-6000:]}")
    return out


def jobs_run(output: str) -> dict[str, int]:
    """The 'Job stats' table of a snakemake run or dry run, by rule. Every job is a stage's, but the default
    target `all` (which runs nothing): asserted here."""
    table = output.split("Job stats:")[1]
    jobs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}
    assert set(jobs) <= set(STAGES) | {"all"}, jobs
    return jobs


# Set while the demo runs: their values must end up in no file the workflow writes.
SECRETS = {"HF_TOKEN": "hf_MarkerTokenValue0123456789", "WANDB_API_KEY": "MarkerWandbKey0123456789abcdef0123456789"}


def train_digest(workdir: Path, run_id: str) -> str:
    manifest = json.loads((workdir / "results/runs" / run_id / "train.manifest.json").read_text())
    return manifest["outputs"]["final"]["tree_sha256"]


def first_run_id(workdir: Path) -> str:
    return run(["videogrpo", "config", "--configfile", "config/config.yaml", "--run-id"], workdir).stdout.strip()
