"""What a stage cost: the `cost` block of its manifest (wall time, CPU time, GPUs and GPU-hours).

Measured over the stage itself (from StageRun's entry to its manifest), never estimated from the config
alone: CPU time is getrusage of this process plus its children that have been waited for (torchrun and,
through it, every rank it started on this host; a scorer or judge process the stage ran; not the ranks of a
multi-node SLURM training, which srun starts through each node's slurmd), and the GPUs
are the stage's own facts (see `stage_gpus`). Read by the report, `videogrpo trace` and `videogrpo diff`
(provenance/trace.py); a manifest without the block (written before it existed) shows as unknown there.

The SLURM state is "COMPLETED" by construction: a manifest is written only when its stage succeeded, and
the job is still RUNNING at that moment, so what squeue or sacct would say then is no news; the trace
asks sacct for each job's final state when sacct answers.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

from videogrpo.provenance import slurm_job

STATE = "COMPLETED"


def cpu_seconds() -> tuple[float, float]:
    """User and system CPU time of this process, and of its waited-for children (and theirs), so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def visible_devices(env: dict[str, str]) -> int | None:
    """How many GPUs CUDA_VISIBLE_DEVICES names (None: unset, every device of the host is visible)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    # SLURM sets "NoDevFiles" for a job without GPUs; "-1" (or any invalid first entry) hides every device.
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if not entries or entries[0] in ("-1", "NoDevFiles"):
        return 0
    return len(entries)


def allocated_gpus(env: dict[str, str]) -> int | None:
    """The GPUs SLURM gave this job on this node (billed whether used or not); None outside a SLURM job, and where
    SLURM does not confirm the job the environment names (provenance/slurm_job.py): a stray SLURM_JOB_ID bills
    nothing."""
    if slurm_job.confirmed_job_id(env) is None:
        return None
    if (on_node := env.get("SLURM_GPUS_ON_NODE", "")).isdigit():
        return int(on_node)
    return visible_devices(env) or 0


def devices_used() -> int:
    """The CUDA devices this process allocated memory on (0 when it never initialized CUDA: light stages,
    CPU-only runs; torch is never imported for this)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return sum(1 for i in range(torch.cuda.device_count()) if torch.cuda.max_memory_reserved(i) > 0)


def training_gpus(nodes: int, procs_per_node: int, device: str, env: dict[str, str]) -> tuple[int, str]:
    """Training's GPUs, nodes x GPUs per node: in a SLURM job the node's allocation (every node of the job
    asks for the same), otherwise one GPU per rank of the topology; 0 on CPU."""
    if device != "cuda":
        return 0, f"parallel.device = {device}: no GPU"
    if (per_node := allocated_gpus(env)) is not None:
        return nodes * per_node, f"{nodes} nodes x {per_node} GPUs of the SLURM allocation per node"
    return nodes * procs_per_node, f"{nodes} nodes x {procs_per_node} ranks (parallel.procs_per_node), one GPU each"


def stage_gpus(env: dict[str, str], used: int) -> tuple[int, str]:
    """A single-node stage's GPUs: its SLURM allocation inside a job, else the devices it used."""
    if (allocated := allocated_gpus(env)) is not None:
        return allocated, "the SLURM allocation of the job"
    return used, "CUDA devices the stage allocated memory on" if used else "no CUDA device used, outside SLURM"


def cost_block(wall_s: float, cpu_s: tuple[float, float], gpus: int, gpus_from: str, nodes: int = 1) -> dict[str, Any]:
    """The manifest's `cost` from the CPU seconds of (the stage's process, its children): seconds and hours, and
    where the GPU count came from."""
    return {
        "wall_s": round(wall_s, 3),
        "cpu_s": round(sum(cpu_s), 3),
        "cpu_children_s": round(cpu_s[1], 3),
        "cpu_h": round(sum(cpu_s) / 3600, 6),
        "nodes": nodes,
        "gpus": gpus,
        "gpus_from": gpus_from,
        "gpu_h": round(gpus * wall_s / 3600, 6),
        "state": STATE,
    }


def measure(wall_s: float, cpu_s: tuple[float, float], gpus: tuple[int, str] | None, nodes: int = 1) -> dict[str, Any]:
    """The cost block of a stage that ran `wall_s` seconds and (its own, its children's) `cpu_s` CPU seconds;
    `gpus` as the stage declared them (training), else found as stage_gpus finds them."""
    env = dict(os.environ)
    count, source = gpus if gpus is not None else stage_gpus(env, devices_used())
    return cost_block(wall_s, cpu_s, count, source, nodes)
