"""The per-node preflight's real probe on a GPU node: every check it makes passes where the node is fit."""

from __future__ import annotations

import os
import subprocess
import sys

from videogrpo.config import from_dict
from videogrpo.preflight import node as node_preflight
from videogrpo.preflight.checks import node_checks


def test_the_real_probe_passes_on_this_gpu_node(tmp_path):
    cfg = from_dict(
        {"parallel": {"device": "cuda", "backend": "nccl", "procs_per_node": 1, "attention_backend": "native"}},
        partial=True,
    )
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    facts = node_preflight.probe("cuda", env)
    checks = node_checks(cfg, devices=1, facts=facts)
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    assert not failed, failed
    assert facts.driver_version and facts.nccl_version, facts


def test_preflight_only_on_this_gpu_node_exits_0():
    config = '{"parallel": {"procs_per_node": 1, "nodes": 1, "device": "cuda", "backend": "nccl", "attention_backend": "native"}}'  # noqa: E501
    run = subprocess.run(
        [sys.executable, "-m", "videogrpo.cli", "stage", "train", "--preflight-only", "--config-json", config],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[preflight] node" in run.stdout + run.stderr
