"""Every script under bench/ keeps running: each one runs at its smallest size (`--smoke`, seconds) and prints a table.

A benchmark that no test runs rots: bench_dryrun.py copied the checkout file by file and broke when `slurm` became a
link to the profile. The scripts are found by glob, so a new one is run here too; one that cannot run on this
machine is listed in NOT_RUN with the reason. Nothing is asserted about speed (the full runs are manual, their
numbers go to bench/RESULTS.md): only that a script runs and prints a table row of numbers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
SCRIPTS = sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py")

# Scripts no smoke runs here, and why.
NOT_RUN = {
    "gpu_smoke.py": "its CPU form (--cpu) runs in tests/test_gpu_smoke.py, through gpu_smoke.sh --cpu",
    "gpu_smoke.sh": "its CPU form (--cpu) runs in tests/test_gpu_smoke.py",
    "gpu_wheels.sh": "downloads CUDA wheels from the package index",
    "raw_compute.py": "no benchmark of its own: bench_trainer.py runs it under torchrun, in its smoke too",
    "slow_worker.py": "no benchmark of its own: bench_actors.py runs it under torchrun, in its smoke too",
}

# A table row of numbers: a cell that is a number, maybe with a unit (`2.94 s`, `31%`, `x1.03`).
NUMBER_CELL = re.compile(r"\|\s*x?-?\d+(\.\d+)?( s|%)?\s*(?=\|)")


def table_rows(text: str) -> list[str]:
    """The body rows of the markdown tables in `text` (the lines after a `|---|` separator) that hold a number."""
    rows, in_table = [], False
    for line in text.splitlines():
        if re.fullmatch(r"\|(-+\|)+", line.strip()):
            in_table = True
        elif in_table and line.startswith("|"):
            rows += [line] if NUMBER_CELL.search(line) else []
        else:
            in_table = False
    return rows


def test_every_script_left_out_exists():
    assert set(NOT_RUN) <= set(SCRIPTS), f"NOT_RUN lists scripts bench/ no longer has: {set(NOT_RUN) - set(SCRIPTS)}"


def test_table_rows_finds_body_rows_of_numbers_only():
    text = "title\n\n| a | b |\n|---|---|\n| tiny | 2.94 s |\n| x | - |\n\n| c |\n|---|\n| 31% |\nafter\n| 1 |"
    assert table_rows(text) == ["| tiny | 2.94 s |", "| 31% |"]


@pytest.mark.parametrize("script", [name for name in SCRIPTS if name not in NOT_RUN])
def test_the_script_runs_at_its_smallest_size(script):
    interpreter = sys.executable if script.endswith(".py") else "bash"
    run = subprocess.run(
        [interpreter, f"bench/{script}", "--smoke"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, (
        f"bench/{script} --smoke exited {run.returncode} (a script under bench/ takes --smoke, its smallest size in "
        f"seconds, or NOT_RUN in {Path(__file__).name} says why it cannot run here):\n"
        f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    assert table_rows(run.stdout), f"bench/{script} --smoke printed no table row of numbers:\n{run.stdout[-3000:]}"
