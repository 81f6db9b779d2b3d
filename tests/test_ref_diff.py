"""tools/ref_diff's project side on stored inputs, against the reference trainer's stored results on them.

Each file of tests/data/ref_diff holds small inputs (prompt embeddings, first-frame conditions, rewards, replayed
timesteps, per-prompt etas) and what the reference implementation's own trainer (pufanyi/vbvr-rl, run by
tools/ref_diff/run_all.sh) computed from them: rolled-out and replayed log-probabilities, update metrics, and
samples of the latents, parameters and AdamW moments. The project's real trainer runs here on the same inputs
through the tool's adapter and must agree within float round-off (tools/ref_diff/tolerances.py). A change
of the trainer's interface breaks this test (fix tools/ref_diff/project_adapter.py); a change of its arithmetic
fails the comparison.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO

TOOL = REPO / "tools/ref_diff"
DATA = REPO / "tests/data/ref_diff"
CASES = sorted(DATA.glob("*.pt"))
sys.path.insert(0, str(TOOL))

import stored  # noqa: E402


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory) -> Path:
    """The tiny TI2V model (the session's) and the tiny two-expert I2V model, as the tool builds them."""
    import project_adapter

    work = tmp_path_factory.mktemp("ref_diff")
    (work / "tiny").symlink_to(tiny_model)
    project_adapter.build_tiny_models(work)
    return work


def test_stored_comparisons_are_there():
    assert {p.stem for p in CASES} >= {
        "ti2v_dancegrpo_fp32",
        "ti2v_flowcps_delayed_fp32",
        "ti2v_flowcps_delayed_bf16",
        "a14b_flowcps_eta_range_fp32",
    }
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 400_000


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_project_side_agrees_with_the_reference(path, models, tmp_path):
    kind = torch.load(path)["inputs"]["set"]["kind"]
    model = models / ("tiny_i2v" if kind == "i2v_a14b" else "tiny")
    _, problems, rows = stored.run_stored(path, model, tmp_path)
    assert rows and not problems, "\n".join(problems)


def test_only_the_adapter_imports_the_project():
    """Every touch of the project's internals is in project_adapter.py: the one place to fix when they change."""
    for source in TOOL.glob("*.py"):
        tree = ast.parse(source.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        touches = [m for m in names if m.split(".")[0] == "videogrpo"]
        assert source.name == "project_adapter.py" or not touches, (source.name, touches)
