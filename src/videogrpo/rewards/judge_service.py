"""The per-node judge service: started by the training job before its ranks, stopped when they end.

One vLLM OpenAI-compatible server per node on loopback (reward.judge_port), from the judge's own
environment (reward.judge_python), serving the pinned judge model (fetch_judge) under
reward.judge_served_name with the data- and tensor-parallel layout and GPU memory share of the config.
The job waits until the service lists the model, and fails naming the command and its last log
lines if it exits or never answers. With reward.judge_endpoint set, an existing service is used and
only probed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from videogrpo.errors import VideoGRPOError
from videogrpo.rewards.judge import endpoint_of, wait_ready


def serve_argv(cfg, model: Path) -> list[str]:
    r = cfg.reward
    values = {
        "python": r.judge_python or sys.executable,
        "model": str(model),
        "name": r.judge_served_name,
        "port": str(r.judge_port),
        "tensor_parallel": str(r.judge_tensor_parallel),
        "data_parallel": str(r.judge_data_parallel),
        "gpu_memory": str(r.judge_gpu_memory),
        "max_model_len": str(r.judge_max_model_len),
        "max_num_seqs": str(r.judge_max_num_seqs),
    }
    try:
        return [part.format(**values) for part in r.judge_serve_command]
    except (KeyError, IndexError) as err:
        raise VideoGRPOError(
            f"reward.judge_serve_command: unknown placeholder {err}; known: {', '.join('{' + k + '}' for k in values)}"
        ) from None


@contextmanager
def judge_service(cfg, model: Path | None, log: Path) -> Iterator[str]:
    """Yield the judge endpoint, with a service of this node running for the duration of the block."""
    if cfg.reward.kind != "vbvr_vlm":
        yield ""
        return
    endpoint = endpoint_of(cfg)
    if cfg.reward.judge_endpoint:
        try:
            names = wait_ready(endpoint, min(60.0, cfg.reward.judge_ready_timeout_s))  # it is up, or not
        except VideoGRPOError as err:
            raise VideoGRPOError(
                f"reward.judge_endpoint = {cfg.reward.judge_endpoint!r}: {err}. Start the judge service there, fix "
                f"the URL, or leave reward.judge_endpoint empty so that the training job starts one per node "
                f"(reward.judge_port)"
            ) from None
        check_served(cfg, names, endpoint)
        yield endpoint
        return
    if model is None:
        raise VideoGRPOError("the vbvr_vlm reward needs the judge model (fetch_judge) or reward.judge_endpoint")
    argv = serve_argv(cfg, model)
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[judge] starting: {' '.join(argv)} (log: {log})", file=sys.stderr, flush=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            names = wait_ready(endpoint, cfg.reward.judge_ready_timeout_s, process)
        except VideoGRPOError as err:
            tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-15:])
            raise VideoGRPOError(f"{err}\n  command: {' '.join(argv)}\n  last lines of {log}:\n    {tail}") from None
        check_served(cfg, names, endpoint)
        print(f"[judge] ready at {endpoint}: {names}", file=sys.stderr, flush=True)
        yield endpoint
    finally:
        stop(process)


def check_served(cfg, names: list[str], endpoint: str) -> None:
    if cfg.reward.judge_served_name not in names:
        raise VideoGRPOError(
            f"the judge service at {endpoint} serves {names}, not reward.judge_served_name = "
            f"{cfg.reward.judge_served_name!r}"
        )


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the service's process group, SIGKILL what is left after the grace period."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass
