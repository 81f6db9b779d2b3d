"""Shared fixtures: a tiny model, synthetic archives and a materialized dataset, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The judge's stand-in pinned sources shipped for the tiny default, and the fields of their rubrics.
PROTOCOL_FILE = REPO / "src/videogrpo/demo/stand_in_judge_protocol.py"
RUBRIC_FILE = REPO / "src/videogrpo/demo/stand_in_judge_prompts.py"
JUDGE_FIELDS = ["goal_score", "quality_score", "goal_weight", "quality_weight", "total_score", "reason"]
TASKS = [
    "S-1_move_red_square_data-generator",
    "S-2_fill_circle_blue_data-generator",
    "S-3_grow_bar_to_line_data-generator",
]
SAMPLES = 3
FRAMES, SIDE = 17, 64

os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from videogrpo.demo.tiny_ti2v import save_tiny_pipeline

    out = tmp_path_factory.mktemp("model") / "pipeline"
    save_tiny_pipeline(out, seed=0)
    return out


@pytest.fixture(scope="session")
def archives(tmp_path_factory) -> Path:
    from videogrpo.demo import synthetic_dataset

    out = tmp_path_factory.mktemp("archives")
    synthetic_dataset.generate(out, TASKS, SAMPLES, seed=0, frames=FRAMES, height=SIDE, width=SIDE, fps=16)
    return out


@pytest.fixture(scope="session")
def dataset(archives, tmp_path_factory) -> Path:
    from videogrpo.data.materialize import materialize

    out = tmp_path_factory.mktemp("dataset")
    materialize(
        sorted((archives / "VBVR-Pro-RL-Video").glob("*.tar.gz")),
        out,
        TASKS,
        SAMPLES,
        1,
        42,
        "synthetic_3",
        {"repo": "synthetic"},
        log=lambda _: None,
    )
    return out


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A real 256 KiB file system (tmpfs; the tests run as root, as CI does), for disk-full behaviour."""
    import subprocess

    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.fail(f"cannot mount a tmpfs for the disk-full test (needs root): {done.stderr.decode()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="session")
def evalkit(repo) -> Path:
    return repo / "src/videogrpo/demo/stand_in_evalkit"


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A fresh copy of the checkout, where the demo runs: shared by every e2e module of the session."""
    from demo import copy_checkout

    return copy_checkout(tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="session")
def demo(workdir):
    """`snakemake -n` on the fresh checkout, then `make demo`, as the README says."""
    from demo import SECRETS, VENV, run

    dry = run(["snakemake", "-n"], workdir)
    assert not (workdir / "results").exists(), "a dry run wrote under results/"
    # -o: never (re)install into the running environment from this temporary copy.
    made = run(["make", "demo", f"VENV={VENV}", "-o", f"{VENV}/.installed"], workdir, **SECRETS)
    return dry, made


def pytest_collection_modifyitems(config, items):
    """The GPU tier (tests/gpu/): every test there needs CUDA and is skipped without it (CI has none). On a GPU
    node, from the GPU environment: `pytest tests/gpu -q`, or `bash bench/gpu_smoke.sh`."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the GPU tier: bash bench/gpu_smoke.sh on a GPU node)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
