"""bench/gpu_smoke.sh stays ready for a GPU machine: the same script, every part of it, on CPU with small shapes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import doc_commands

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_smoke_script_runs_every_part_on_cpu(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    run = subprocess.run(
        ["bash", "bench/gpu_smoke.sh", "--cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    doc_commands.record(["bash", "bench/gpu_smoke.sh", "--cpu"], run.returncode)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    smoke = (tmp_path / "gpu-smoke.log").read_text()
    parts = ("Node", "Attention backends", "torch.compile on the blocks", "GRPO updates through the trainer: cpu-small")
    for title in parts:
        assert f"\n{title}" in smoke, f"part {title!r} missing:\n{smoke}"
    assert "| native | runs | 0.00e+00 |" in smoke
    rows = [line for line in smoke.splitlines() if line.startswith("| cpu-small |")]
    assert [row.split(" | ")[2] for row in rows] == ["1", "2"], smoke  # both delayed-replay updates ran
    assert "failed" not in "".join(rows)
    # One process with data_parallel fsdp is FSDP2 over a mesh of one, not a silent unsharded fallback.
    layout = next(line for line in smoke.splitlines() if line.startswith("cpu-small: parameter layout"))
    assert '"sharded": 0' not in layout and '"mesh_shape"' in layout, layout
    # The GPU tier is collected and skipped, not broken, where there is no CUDA.
    tests = (tmp_path / "gpu-tests.log").read_text()
    assert " skipped" in tests and "error" not in tests.lower(), tests
