"""What each machine of a training job does, one function per role of `videogrpo stage train`, each in the order it
runs:
- `preflight_only_run` (`--preflight-only`): the per-node checks on every node of the SLURM allocation (through
  srun) or on this machine, one report line per node, 0 or 1;
- `train_this_node` (`--node-only`, srun's task on each node; a manual launch's other machines; the first machine of
  a launch without srun): find this machine's place in the job (torchrun.py); probe the node once and decide the
  per-node checks (preflight/node.py: devices, driver, NCCL, Triton and its cache on node-local disk, the allocator
  setting); on CUDA with a Hub attention kernel, load that kernel offline from fetch_kernel's cache as the ranks
  will; refuse the node, naming every failed check and its fix, before a rank starts; set the ranks' environment
  (torchrun.worker_env, the kernel's offline loader); start this node's judge service where the recipe co-hosts one
  (rewards/judge_service.py: the ranks start only once it holds its share of the GPUs); and then run torchrun for
  this machine's processes, turning its exit into what the stage reports.
The first machine's own role, which starts the others (`run_srun`) and records what they made, is the train stage's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from videogrpo.artifacts import attention_kernel
from videogrpo.config import Config
from videogrpo.config.checks import uses_hub_kernel
from videogrpo.errors import VideoGRPOError
from videogrpo.launch import torchrun
from videogrpo.preflight import checks as preflight
from videogrpo.preflight import node as node_preflight
from videogrpo.provenance import interconnect
from videogrpo.rewards.judge_service import judge_service, rendezvous_join_timeout

WORKER = "videogrpo.grpo.worker"


@dataclass
class NodeTraining:
    """What every machine's torchrun workers are handed: the same on every machine of a job."""

    config_json: str
    run_id: str
    run_dir: Path
    model: Path
    dataset: Path
    final: Path
    metrics: Path
    input_digests: dict[str, str]
    evalkit: Path | None = None
    judge_model: Path | None = None
    kernel_cache: Path | None = None
    refiners: dict[str, Path] = field(default_factory=dict)
    """Each prompt refiner's download by name (the `refiners` section)."""

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def worker_args(self) -> list[str]:
        args = ["--config-json", self.config_json, "--run-id", self.run_id, "--model", str(self.model)]
        args += ["--dataset", str(self.dataset), "--checkpoints", str(self.checkpoints), "--final", str(self.final)]
        args += ["--metrics", str(self.metrics), "--run-dir", str(self.run_dir)]
        args += ["--input-digests", json.dumps(self.input_digests)]
        args += [f"--refiner={name}={path}" for name, path in sorted(self.refiners.items())]
        return args + (["--evalkit", str(self.evalkit)] if self.evalkit else [])


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def preflight_only_run(cfg: Config, kernel_cache: Path | None, srun_command: list[str] | None) -> int:
    """The per-node checks only, on every node of the SLURM allocation this shell runs in (srun starts
    `srun_command`, this stage's command with --node-only, on each; None: this process is such a node) or on this
    machine: each node's report line on stdout; 0 when all pass, else 1. Nothing is trained or written."""
    nodes = torchrun.allocation_nodes(cfg) if srun_command else 0
    if nodes > 1:
        code = run_srun(cfg, srun_command, nodes=nodes, kill_on_bad_exit=False)
        print(
            f"[preflight] {'all' if code == 0 else 'NOT all'} of the allocation's {nodes} nodes passed"
            + ("" if code == 0 else f" (srun exited {code}): the FAIL lines above name the nodes and the fixes"),
            flush=True,
        )
        return 0 if code == 0 else 1
    where = torchrun.from_environment(cfg, check_nodes=False)  # the checks are per machine: any allocation size
    log(f"[launch] {describe(where)}")
    facts = node_preflight.probe(cfg.parallel.device, torchrun.worker_env(cfg))
    checks = preflight.node_checks(cfg, port=where.hosted_port, facts=facts) + kernel_load(cfg, kernel_cache, facts)
    print(report(cfg, where, facts, checks), flush=True)
    return 0 if all(c.ok for c in checks) else 1


def train_this_node(cfg: Config, job: NodeTraining) -> None:
    """Training on this machine (srun's task on a node, a manual launch's other machine, the first machine of a
    launch without srun): the per-node checks, the ranks' environment, the co-hosted judge, then torchrun for this
    machine's processes; raises VideoGRPOError naming the node when a check or a rank failed, KeyboardInterrupt on
    Ctrl-C."""
    where = torchrun.from_environment(cfg)
    log(f"[launch] {describe(where)}")
    facts = node_preflight.probe(cfg.parallel.device, torchrun.worker_env(cfg))
    checks = preflight.node_checks(cfg, port=where.hosted_port, facts=facts) + kernel_load(cfg, job.kernel_cache, facts)
    log(report(cfg, where, facts, checks))
    if failed := [f"{c.name}: {c.detail}" for c in checks if not c.ok]:
        raise VideoGRPOError(f"per-node preflight failed on node {where.node_rank}:\n  " + "\n  ".join(failed))
    # Taken after the checks, not with the probe's: what they import may set variables the ranks inherit (diffusers'
    # attention dispatch sets TORCHINDUCTOR_CACHE_DIR).
    env = torchrun.worker_env(cfg)
    # Every node says what its workers get: a node whose own environment differs shows in its log.
    log(f"[launch] interconnect: {interconnect.describe(torchrun.workers_interconnect(env))}")
    if job.kernel_cache:  # diffusers loads the Hub kernel when the backend is set: from this cache only
        env.update(attention_kernel.loader_env(job.kernel_cache))
    judge_log = job.run_dir / "logs" / f"judge-node{where.node_rank}.log"
    # The ranks start only once this node's judge holds its share of the GPUs (judge_service.py says why).
    with judge_service(cfg, job.judge_model, judge_log):
        argv = torchrun.torchrun_argv(where, WORKER, job.worker_args(), rendezvous_join_timeout(cfg))
        code, said = run_forwarding(argv, env)
    if code in (130, -signal.SIGINT):  # Ctrl-C: the ranks stopped on request, none failed
        raise KeyboardInterrupt
    if code != 0:
        if not said:  # a rank died without its own line (a crash): its traceback is in the log
            raise VideoGRPOError(
                f"torchrun exited with code {code} on node {where.node_rank}; the log above has the failing "
                f"rank's error. Complete checkpoints in {job.checkpoints} are kept: rerun to resume."
            )
        # Whether a rerun resumes is the ranks' to say (a refused resume does not): only what is kept is said here.
        kept = f"complete checkpoints in {job.checkpoints} are kept"
        # Each rank's error again, last: torchrun's own report of the failure (a traceback per rank) follows the
        # ranks' lines and would bury the one that names the file or field and the fix.
        lines = "\n".join(f"  rank {', '.join(map(str, ranks))}: {message}" for message, ranks in said.items())
        raise VideoGRPOError(
            f"torchrun exited with code {code} on node {where.node_rank} ({kept}); the ranks' errors:\n{lines}"
        )


def kernel_load(cfg: Config, cache: Path | None, facts: node_preflight.NodeFacts) -> list[preflight.Check]:
    """On CUDA with a Hub attention kernel: that kernel loaded offline from fetch_kernel's cache, as the ranks will."""
    if not (uses_hub_kernel(cfg) and cfg.parallel.device == "cuda" and facts.device_count):
        return []
    ok, detail = attention_kernel.load_check(cfg, cache, facts.hostname)
    return [preflight.Check("attention_kernel_load", ok, detail)]


def report(cfg: Config, where: torchrun.Launch, facts: node_preflight.NodeFacts, checks: list[preflight.Check]) -> str:
    """Each check on a log line; the node's one-line report."""
    for check in checks:
        log(f"[launch] [{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
    failed = [c.name for c in checks if not c.ok]
    verdict = f"FAIL ({', '.join(failed)})" if failed else "ok"
    return (
        f"[preflight] node {where.node_rank}/{where.nnodes} {facts.hostname}: {verdict}: "
        f"{node_preflight.summary(facts, cfg.parallel.device)}"
    )


def describe(launch: torchrun.Launch) -> str:
    """This machine's place in the job, for its log."""
    node = os.environ.get("SLURMD_NODENAME", "")
    return (
        f"node {launch.node_rank}/{launch.nnodes} on {socket.gethostname()}{' (' + node + ')' if node else ''}, "
        f"{launch.nproc} processes, rendezvous {launch.master_addr}:{launch.master_port} ({launch.source})"
    )


def run_srun(cfg: Config, command: list[str], **options) -> int:
    """`command` once on each node of the allocation (torchrun.srun_argv); srun's exit code."""
    argv = torchrun.srun_argv(cfg, command, **options)
    log(f"[launch] {' '.join(argv[:8])} ... in job {os.environ.get('SLURM_JOB_ID')}")
    try:
        return subprocess.run(argv, check=False).returncode
    except FileNotFoundError:
        raise VideoGRPOError(
            "srun not found inside a SLURM allocation; is the SLURM client on the compute nodes' PATH?"
        ) from None


RANK_ERROR = re.compile(r"^\[rank (\d+)\] error: (.+)$")


def run_forwarding(argv: list[str], env: dict[str, str]) -> tuple[int, dict[str, list[int]]]:
    """Run torchrun with its output (and its ranks') passed on to our stderr as it comes, keeping each rank's
    `[rank N] error: ...` line; returns the exit code and {the error's first line: the ranks that printed it}. A
    Ctrl-C is handled as subprocess.run handles it (torchrun gets a moment to stop, then is killed)."""
    read, write = os.pipe()
    said: dict[str, list[int]] = {}
    forwarder = threading.Thread(target=_forward, args=(read, said), daemon=True)
    forwarder.start()
    try:
        return subprocess.run(argv, env=env, check=False, stdout=write, stderr=write).returncode, said
    finally:
        os.close(write)
        forwarder.join(timeout=10)  # a process the ranks started may hold the pipe: not waited for


def _forward(read: int, said: dict[str, list[int]]) -> None:
    out = getattr(sys.stderr, "buffer", None)
    pending = b""
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            try:  # as it comes, carriage returns and all: progress lines stay live
                if out is not None:
                    out.write(chunk)
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone or full: keep reading, the ranks must not block
                pass
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if match := RANK_ERROR.match(line.decode(errors="replace").rstrip("\r")):
                    said.setdefault(match.group(2), []).append(int(match.group(1)))
