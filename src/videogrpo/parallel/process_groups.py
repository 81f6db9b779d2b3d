"""torch.distributed set-up from torchrun's environment, and the few collectives the trainer uses."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# The reference's process-group timeout (docs/reference-system.md#memory): a collective may wait this long for the
# slowest rank, e.g. one decoding and scoring a large rollout group or writing a checkpoint.
PROCESS_GROUP_TIMEOUT_S = 240 * 60


@dataclass(frozen=True)
class Context:
    rank: int
    """This process's rank: in the job (a train rank's is also its rank among the train ranks)."""
    world_size: int
    """Ranks of the default process group: the job's, or with rollout actors the train ranks' (an actor's: the
    job's)."""
    local_rank: int
    device: torch.device
    link: Any = None
    """With rollout actors: the link over every rank of the job (parallel.link.Link); None without."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_actor(self) -> bool:
        """A rollout actor: a rank of the job beyond the train ranks."""
        return self.link is not None and self.rank >= self.link.train_world


def init(
    device_kind: str,
    backend: str,
    cpu_threads: int,
    timeout_s: int = PROCESS_GROUP_TIMEOUT_S,
    group_of_one: bool = False,
    train_world: int | None = None,
    stall_timeout_s: float = 600.0,
) -> Context:
    """Join the process group torchrun prepared (or a world of one without torchrun).

    group_of_one: make the group for a world of one too, when torchrun started it (FSDP2 needs a mesh).
    train_world: with rollout actors (fewer than the job's ranks), the ranks that train: they make the default group
    on their own, and every rank joins the link (parallel.link) with `stall_timeout_s`.
    """
    torch.set_num_threads(cpu_threads)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if train_world is not None and train_world < world:
        from videogrpo.parallel import link as link_mod

        device_id = device if device_kind == "cuda" else None
        joined = link_mod.connect(rank, world, train_world, backend, stall_timeout_s, device_id, timeout_s)
        return Context(rank, train_world if rank < train_world else world, local_rank, device, joined)
    one = group_of_one and world == 1 and "MASTER_ADDR" in os.environ
    if (world > 1 or one) and not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device_kind == "cuda" else None,
        )
    return Context(rank, world, local_rank, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def all_gather_objects(obj: Any) -> list[Any]:
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def reduce_floats(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Sum (or max) each value over all ranks, in float64: metrics of every rank's share of the data."""
    if not active():
        return list(values)
    buffer = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return buffer.tolist()


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """All-reduce and average gradients of replicated parameters (one flat buffer, one collective)."""
    if not active():
        return
    for p in params:
        if p.grad is None:  # every rank must contribute the same buffer layout
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def barrier() -> None:
    if active():
        dist.barrier()
