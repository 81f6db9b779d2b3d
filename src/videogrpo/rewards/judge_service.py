"""The per-node judge service: started by the training job before its ranks, stopped when they end.

One vLLM OpenAI-compatible server per node on loopback (reward.judge_port), from the judge's own
environment (reward.judge_python), serving the pinned judge model (fetch_judge) under
reward.judge_served_name with the data- and tensor-parallel layout and GPU memory share of the config.
The job waits until the service lists the model, and fails naming the command and its last log
lines if it exits or never answers. With reward.judge_endpoint set, an existing service is used and
only probed (`reach_endpoint`, which the preflight stage asks too).

Sharing the GPUs (reward.judge_gpu_memory of each GPU is the judge's, the rest training's) is made
safe by the order of start-up, which `train_this_node` (launch/node.py) follows on every node:
1. the per-node checks, which must allocate no device memory in the launcher process (it lives as long
   as the job: a check that needs a CUDA context runs it in a child process);
2. the judge service, waited for until it lists the model: vLLM answers only once its weights are
   loaded and its KV cache is allocated at its share (its start-up refuses to run when that share is
   not free), so by then the judge holds all the memory it will take;
3. torchrun, started only inside the block that yields the ready endpoint; every rank caps its own
   caching allocator at 1 - reward.judge_gpu_memory of its GPU before it loads a model
   (`training_memory_fraction`, applied by the worker), so training runs out of its own share with
   an error of its own rather than taking the judge's.
Nodes whose judge is ready sooner wait for the others at torchrun's rendezvous, whose join timeout is
raised to the judge's ready timeout (`rendezvous_join_timeout`) so that they do not give up first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from videogrpo.config import reward_kinds, training_reward_kinds
from videogrpo.errors import VideoGRPOError
from videogrpo.rewards.judge import endpoint_of, wait_ready


def uses_judge(cfg) -> bool:
    """The run scores with the VLM judge (reward.kind vbvr_vlm, or a vbvr_vlm term of reward.terms)."""
    return "vbvr_vlm" in reward_kinds(cfg)


def co_hosted(cfg) -> bool:
    """The training job starts the judge on its own GPUs (vbvr_vlm without reward.judge_endpoint, on CUDA)."""
    return uses_judge(cfg) and not cfg.reward.judge_endpoint and cfg.parallel.device == "cuda"


def training_memory_fraction(cfg) -> float | None:
    """The share of each GPU a training rank may allocate: what the co-hosted judge leaves (None: all of it)."""
    if not co_hosted(cfg):
        return None
    return 1.0 - cfg.reward.judge_gpu_memory


def cap_training_memory(cfg, device, cuda=None) -> float | None:
    """Cap this rank's caching allocator at its share of its GPU, before any model is loaded; the cap set."""
    fraction = training_memory_fraction(cfg)
    if fraction is None or device.type != "cuda":
        return None
    if cuda is None:
        import torch

        cuda = torch.cuda
    cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def rendezvous_join_timeout(cfg) -> float | None:
    """Seconds torchrun's rendezvous waits for every node: the judge's ready timeout and torchrun's own 600 s
    when each node starts a judge first (None: torchrun's default)."""
    if not uses_judge(cfg) or cfg.reward.judge_endpoint:
        return None
    return cfg.reward.judge_ready_timeout_s + 600.0


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
    if not uses_judge(cfg):
        yield ""
        return
    if cfg.reward.judge_endpoint:
        endpoint, note = reach_or_note(cfg)
        if note:
            print(f"[judge] {note}", file=sys.stderr, flush=True)
        yield endpoint
        return
    endpoint = endpoint_of(cfg)
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


def reach_endpoint(cfg) -> str:
    """The existing service reward.judge_endpoint names answers and serves reward.judge_served_name: its endpoint.

    Training asks before its ranks start, and the preflight stage before a training job is submitted, so that a dead
    endpoint fails once, early, with the same words (VideoGRPOError naming the field and the fixes).
    """
    endpoint = cfg.reward.judge_endpoint
    try:
        names = wait_ready(endpoint, min(60.0, cfg.reward.judge_ready_timeout_s))  # it is up, or not
    except VideoGRPOError as err:
        raise VideoGRPOError(
            f"reward.judge_endpoint = {endpoint!r}: {err}. Start the judge service there, fix the URL, or leave "
            f"reward.judge_endpoint empty so that the training job starts one per node (reward.judge_port)"
        ) from None
    check_served(cfg, names, endpoint)
    return endpoint


def gold_only_note(cfg, err: VideoGRPOError) -> str | None:
    """Where only a gold reward (train.validate_rewards) scores with the judge, what a dead endpoint means: training
    goes on and each validation point goes without the judge's numbers (None: training needs the judge, or
    train.validate_rewards_fail_on_error asks to stop, so the error stands, saying which reward needs it)."""
    if "vbvr_vlm" in training_reward_kinds(cfg):
        return None
    gold = f"only the gold reward vbvr_vlm (train.validate_rewards) needs the judge at {cfg.reward.judge_endpoint}"
    if cfg.train.validate_rewards_fail_on_error:
        raise VideoGRPOError(f"{err} ({gold}, and train.validate_rewards_fail_on_error: true stops on it)") from None
    return (
        f"warning: {err} ({gold}: training goes on, and each validation point goes without the judge's numbers until "
        f"the service answers, saying so; train.validate_rewards_fail_on_error: true stops instead)"
    )


def reach_or_note(cfg) -> tuple[str, str | None]:
    """reach_endpoint, or, for a judge only a gold reward needs, the endpoint and the warning of gold_only_note."""
    try:
        return reach_endpoint(cfg), None
    except VideoGRPOError as err:
        if (note := gold_only_note(cfg, err)) is None:
            raise
        return cfg.reward.judge_endpoint, note


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
