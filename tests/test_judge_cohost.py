"""A co-hosted judge and training share each GPU: the start-up order on a node (the judge stand-in over real HTTP,
torchrun replaced by a recorder), each rank's allocator cap, and the rendezvous that waits for slow judges."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from videogrpo import config
from videogrpo.errors import VideoGRPOError
from videogrpo.launch import torchrun
from videogrpo.launch.node import NodeTraining
from videogrpo.rewards import judge_service

STAND_IN = [sys.executable, "-m", "videogrpo.demo.stand_in_judge", "--port", "{port}", "--name", "{name}"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vlm_config(command: list[str], **parallel) -> config.Config:
    reward = dict(kind="vbvr_vlm", judge_port=free_port(), judge_serve_command=command, judge_ready_timeout_s=30)
    sections = {"reward": reward, "parallel": dict(dict(nodes=1, procs_per_node=1, device="cpu", backend="gloo",
                                                         attention_backend="native"), **parallel)}  # fmt: skip
    return config.from_dict(sections, partial=True)


def node_job(tmp_path: Path, cfg: config.Config) -> NodeTraining:
    return NodeTraining(
        config_json=json.dumps({"reward": {"kind": "vbvr_vlm"}}),
        run_id="run",
        run_dir=tmp_path / "run",
        model=tmp_path / "model",
        dataset=tmp_path / "dataset",
        final=tmp_path / "final",
        metrics=tmp_path / "metrics.jsonl",
        input_digests={},
        judge_model=tmp_path / "judge",
    )


def answers(endpoint: str) -> list[str] | None:
    try:
        with urllib.request.urlopen(endpoint + "/v1/models", timeout=5) as response:
            return [m["id"] for m in json.loads(response.read())["data"]]
    except OSError:
        return None


def test_torchrun_starts_only_once_this_nodes_judge_answers_and_never_when_it_fails(tmp_path, monkeypatch):
    from videogrpo.launch import node

    started = []

    def torchrun(argv, **kwargs):  # what the ranks would see the moment they start
        started.append((argv, answers(f"http://127.0.0.1:{cfg.reward.judge_port}")))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(node.subprocess, "run", torchrun)
    for var in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID"):
        monkeypatch.delenv(var, raising=False)
    cfg = vlm_config([*STAND_IN, "--startup-delay", "2"])  # loading for 2 s before it listens
    node.train_this_node(cfg, node_job(tmp_path, cfg))
    [(argv, served)] = started
    assert served == ["qwen3.6-27b"] and "videogrpo.grpo.worker" in argv
    assert answers(f"http://127.0.0.1:{cfg.reward.judge_port}") is None  # stopped when the ranks ended

    started.clear()
    cfg = vlm_config([sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"])
    with pytest.raises(VideoGRPOError, match="exited with code 3 before it was ready"):
        node.train_this_node(cfg, node_job(tmp_path, cfg))
    assert started == []  # no rank was started beside a judge that never took its share


def test_every_rank_caps_its_allocator_at_what_the_judge_leaves_before_loading_a_model(monkeypatch, tmp_path):
    from videogrpo.grpo import trainer, worker

    events = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: events.append(("cap", f, str(d))))
    cuda0 = torch.device("cuda", 0)
    monkeypatch.setattr(worker.process_groups, "init", lambda *a, **k: worker.process_groups.Context(0, 1, 0, cuda0))
    monkeypatch.setattr(worker.process_groups, "shutdown", lambda: None)

    class Trainer:
        def __init__(self, *args):
            events.append(("load model",))

        def run(self):
            events.append(("train",))

    monkeypatch.setattr(trainer, "Trainer", Trainer)
    sections = {"reward": {"kind": "vbvr_vlm", "judge_gpu_memory": 0.4}, "parallel": {"device": "cuda"}}
    paths = [f"--{name}={tmp_path / name}" for name in ("model", "dataset", "checkpoints", "final", "metrics")]
    argv = ["--config-json", json.dumps(sections), "--run-id", "r", *paths, f"--run-dir={tmp_path}"]
    assert worker.main(argv) == 0
    assert events == [("cap", 0.6, "cuda:0"), ("load model",), ("train",)]

    events.clear()
    sections["reward"]["judge_endpoint"] = "http://judge-node:18080"  # a judge on GPUs of its own
    assert worker.main(["--config-json", json.dumps(sections), *argv[2:]]) == 0
    assert events == [("load model",), ("train",)]


def test_the_training_share_is_what_the_judge_leaves_and_only_where_it_shares_the_gpus():
    def cfg(**reward):
        return config.from_dict(
            {"reward": dict(kind="vbvr_vlm", judge_gpu_memory=0.5, **reward), "parallel": {"device": "cuda"}},
            partial=True,
        )

    assert judge_service.training_memory_fraction(cfg()) == 0.5
    assert judge_service.training_memory_fraction(cfg(judge_endpoint="http://h:1")) is None
    rule = config.from_dict({"reward": {"kind": "vbvr_rule"}, "parallel": {"device": "cuda"}}, partial=True)
    assert judge_service.training_memory_fraction(rule) is None
    calls = []
    cuda = SimpleNamespace(set_per_process_memory_fraction=lambda *a: calls.append(a))
    assert judge_service.cap_training_memory(cfg(), torch.device("cpu"), cuda) is None and calls == []


def test_the_rendezvous_waits_as_long_as_a_judge_may_take_to_start():
    cfg = vlm_config(STAND_IN, nodes=2)
    cfg.reward.judge_ready_timeout_s = 1800
    where = torchrun.Launch(2, 1, "10.0.0.1", 29500, 8, "slurm")
    argv = torchrun.torchrun_argv(where, "m", [], judge_service.rendezvous_join_timeout(cfg))
    assert "--rdzv-conf=is_host=false,join_timeout=2400" in argv
    cfg.reward.judge_endpoint = "http://judge:18080"  # nothing to wait for on the nodes
    assert judge_service.rendezvous_join_timeout(cfg) is None
    assert "--rdzv-conf=is_host=false" in torchrun.torchrun_argv(where, "m", [], None)
