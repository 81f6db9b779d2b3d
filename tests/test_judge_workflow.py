"""End-to-end through real snakemake: the tiny default trained with the VLM judge reward. fetch_judge pins the
judge model from a loopback Hub, the training job starts the judge service (here the chat-completions
stand-in, through reward.judge_serve_command), every rollout is judged over HTTP, and the service stops."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml
from demo import copy_checkout, run

from hub_server import HubServer

pytestmark = pytest.mark.e2e
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tiny_default_trains_on_judge_scores(tmp_path_factory, tmp_path):
    workdir = copy_checkout(tmp_path_factory.mktemp("judge-checkout"))
    port = free_port()
    reward = {
        "kind": "vbvr_vlm",
        "judge_model": "org/tiny-judge",
        "judge_revision": COMMIT,
        "judge_port": port,
        "judge_serve_command": [
            *["{python}", "-m", "videogrpo.demo.stand_in_judge"],
            *["--port", "{port}", "--name", "{name}"],
        ],
        "judge_ready_timeout_s": 60,
    }
    (workdir / "judge.yaml").write_text(yaml.safe_dump({"reward": reward, "train": {"max_steps": 2}}))
    judge_repo = {"config.json": json.dumps({"architectures": ["StandIn"]}).encode()}
    with HubServer({("model", "org/tiny-judge"): {COMMIT: judge_repo}}) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        dry = run(["snakemake", "-n", "train", "--configfile", "judge.yaml"], workdir, **env).stdout
        assert "fetch_judge" in dry and "fingerprint_evalkit" not in dry  # no EvalKit for a judged run
        run(["snakemake", "train", "--cores", "2", "--configfile", "judge.yaml"], workdir, **env)
    (log,) = workdir.glob("results/runs/*/logs/train.log")
    text = log.read_text()
    assert f"[judge] ready at http://127.0.0.1:{port}: ['qwen3.6-27b']" in text
    (judge_log,) = workdir.glob("results/runs/*/logs/judge-node0.log")
    assert "judge stand-in serving qwen3.6-27b" in judge_log.read_text()
    rows = [
        json.loads(line)
        for line in next(workdir.glob("results/runs/*/train/metrics.jsonl")).read_text().split("\n")
        if line
    ]
    assert len(rows) == 2 and all(r["reward_errors"] == 0 for r in rows)
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    manifest = json.loads(next(workdir.glob("results/runs/*/train.manifest.json")).read_text())
    assert any("fetch_judge.manifest.json" in up for up in manifest["upstream"])
    with pytest.raises(urllib.error.URLError):  # the service stopped with the training job
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)


def test_without_the_hub_the_judge_download_names_the_stand_in_and_following_it_trains(tmp_path_factory, tmp_path):
    """`reward={kind: vbvr_vlm}` on the tiny default, on a machine without the Hub: fetch_judge fails naming what the
    demo can use instead (no `message: None`); doing what it says (the stand-in judge, reward.judge_endpoint) trains
    without any download."""
    workdir = copy_checkout(tmp_path_factory.mktemp("judge-offline-checkout"))
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    out = run(["snakemake", "--cores", "2", "--config", "reward={kind: vbvr_vlm}"], workdir, check=False, **offline)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Error in rule fetch_judge:" in text and "message: None" not in text
    (hint,) = re.findall(r"^Without this download, .*$", text, re.M)
    port = free_port()
    suggested = r"`(python -m videogrpo\.demo\.stand_in_judge --port 18080) &`, then --config '(.*?)'"
    start, config = re.search(suggested, hint).groups()
    server = subprocess.Popen(start.replace("18080", str(port)).split(), cwd=workdir)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.2)
        overrides = [config.replace("18080", str(port)), "train={max_steps: 1}"]
        out = run(["snakemake", "--cores", "2", "train", "--config", *overrides], workdir, **offline)
    finally:
        server.kill()
        server.wait()
    assert "fetch_judge" not in out.stdout + out.stderr
    (metrics,) = workdir.glob("results/runs/*/train/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line]
    assert len(rows) == 1 and rows[0]["reward_errors"] == 0
