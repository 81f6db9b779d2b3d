"""Where each parameter of a Wan transformer lives on a rank: the arithmetic of this project's TP plan and of FSDP2's
dim-0 sharding, without torch.

One table says which block projections tensor parallelism splits and along which dimension
(`tensor_parallel.block_plan` builds its torch plan from it); `rank_layout` says which FSDP shard and TP
shard a global rank holds under each data-parallel layout (the meshes of `fsdp.device_mesh` and
`tensor_parallel.device_mesh`, ranks row-major); `local_numels` says how many elements of a parameter a
rank holds and allocates. FSDP2 splits dim 0 of the (TP-local) tensor as `torch.chunk` does: chunks of
ceil(rows / degree) rows, so the last shards may be short or empty, and every rank allocates the padded
chunk (the first one's size). Master weights and the reduce-scattered gradients live in that padded
storage; AdamW's moments are allocated like the unpadded local shard. The memory plan counts with these
functions and `videogrpo simulate` checks them against torch's own sharding at the recipes' world sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

COLWISE = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q", "attn2.to_k", "attn2.to_v", "ffn.net.0.proj")
"""Split along their output features (weight and bias dim 0): each TP rank owns whole heads / a slice of the FFN."""
ROWWISE = ("attn1.to_out.0", "attn2.to_out.0", "ffn.net.2")
"""Split along their input features (weight dim 1); the bias stays whole (added once, after the all-reduce)."""
HEAD_NORMS = ("attn1.norm_q", "attn1.norm_k", "attn2.norm_q", "attn2.norm_k")
"""Wan's Q/K RMSNorm weights, split like the projections' outputs (tensor_parallel.HeadShardedRMSNorm)."""


def tp_split_dim(name: str) -> int | None:
    """The dimension tensor parallelism splits the parameter `name` (a state-dict key) along, None if replicated."""
    if not name.startswith("blocks."):
        return None
    module, _, leaf = name.split(".", 2)[2].rpartition(".")
    if module in COLWISE or module in HEAD_NORMS:
        return 0
    if module in ROWWISE:
        return 1 if leaf == "weight" else None
    return None


@dataclass(frozen=True)
class RankLayout:
    """What one rank holds: FSDP shard `fsdp_rank` of `fsdp_degree` (degree 1: unsharded) of TP shard `tp_rank` of
    `tp` (1: no tensor parallelism)."""

    fsdp_degree: int
    fsdp_rank: int
    tp: int = 1
    tp_rank: int = 0


def rank_layout(data_parallel: str, world: int, shard_group_size: int, tensor_parallel: int, rank: int) -> RankLayout:
    """The layout of global `rank`: HSDP shards within consecutive groups of shard_group_size ranks (mesh
    (replicate, shard)), FSDP over all data replicas, TP peers neighbours (mesh (dp, tp)); one rank holds all."""
    tp = max(1, tensor_parallel)
    replicas, replica = world // tp, rank // tp
    if world == 1 or data_parallel == "replicate":
        return RankLayout(1, 0, tp, rank % tp)
    if data_parallel == "hsdp":
        return RankLayout(shard_group_size, replica % shard_group_size, tp, rank % tp)
    return RankLayout(replicas, replica, tp, rank % tp)


def fsdp_rows(rows: int, degree: int, shard: int) -> tuple[int, int]:
    """(padded rows every shard allocates, rows shard `shard` holds) of dim 0 split as torch.chunk splits it."""
    chunk = -(-rows // degree) if rows else 0
    return chunk, max(0, min(chunk, rows - shard * chunk))


def tp_local_shape(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    dim = tp_split_dim(name) if tp > 1 else None
    if dim is None:
        return tuple(shape)
    if shape[dim] % tp:
        raise ValueError(f"{name}: dimension {dim} of {list(shape)} is not divisible by tensor_parallel = {tp}")
    return tuple(s // tp if i == dim else s for i, s in enumerate(shape))


def local_shape(name: str, shape: tuple[int, ...], layout: RankLayout) -> tuple[int, ...]:
    """The shape of the parameter's local shard on a rank of `layout` (what DTensor.to_local() returns)."""
    local = tp_local_shape(name, shape, layout.tp)
    if layout.fsdp_degree == 1 or not local:
        return local
    _, rows = fsdp_rows(local[0], layout.fsdp_degree, layout.fsdp_rank)
    return (rows, *local[1:])


def global_offset(name: str, shape: tuple[int, ...], layout: RankLayout) -> tuple[int, ...]:
    """Where the rank's local shard starts in the full parameter (what a checkpoint's chunk records): the TP piece's
    start, plus the FSDP chunk's within it (an empty chunk sits at the end of its piece)."""
    local = tp_local_shape(name, shape, layout.tp)
    offsets = [0] * len(shape)
    dim = tp_split_dim(name) if layout.tp > 1 else None
    if dim is not None:
        offsets[dim] = layout.tp_rank * local[dim]
    if layout.fsdp_degree > 1 and local:
        chunk, _ = fsdp_rows(local[0], layout.fsdp_degree, layout.fsdp_rank)
        offsets[0] += min(layout.fsdp_rank * chunk, local[0])
    return tuple(offsets)


def local_numels(name: str, shape: tuple[int, ...], layout: RankLayout) -> tuple[int, int]:
    """(elements allocated, elements held) of the parameter on a rank of `layout`: FSDP's padded shard and its
    unpadded view (equal without FSDP)."""
    local = tp_local_shape(name, shape, layout.tp)
    if layout.fsdp_degree == 1 or not local:
        n = math.prod(local)
        return n, n
    padded, rows = fsdp_rows(local[0], layout.fsdp_degree, layout.fsdp_rank)
    rest = math.prod(local[1:])
    return padded * rest, rows * rest


def sharded_numels(shapes: dict[str, tuple[int, ...]], layout: RankLayout) -> tuple[int, int]:
    """(allocated, held) elements of every parameter in `shapes` on a rank of `layout`."""
    allocated = held = 0
    for name, shape in shapes.items():
        a, h = local_numels(name, shape, layout)
        allocated, held = allocated + a, held + h
    return allocated, held


def sharding_degree(data_parallel: str, world: int, shard_group_size: int) -> int:
    """Ranks one parameter is split over by data parallelism over `world` data replicas (tensor parallelism
    divides further)."""
    if world == 1 or data_parallel == "replicate":
        return 1
    return world if data_parallel == "fsdp" else shard_group_size


def sharded_state_bytes(shape, layout: RankLayout) -> dict[str, int]:
    """The float32 training state of every trained expert on a rank of `layout`, by term: master weights and gradients
    in FSDP's padded shards (the sharded parameter's storage and the reduce-scatter's output), AdamW's two moments
    shaped like the unpadded local shard (torch.zeros_like of it), and one weight copy shaped so too (a clone of it:
    DiffusionNFT's old policy, the moving average of the weights; counted once per copy a run holds). `videogrpo
    simulate` checks these against torch's own sharding at the recipes' world sizes. `shape`:
    preflight.model_shape.ModelShape (its trained experts' parameter shapes, `trained_counts`, and LoRA's adapter
    shapes, `adapters`)."""
    allocated = held = 0
    trainable_allocated = trainable_held = 0
    for index, counts in enumerate(shape.trained_counts):
        if not counts.shapes:
            raise ValueError("the memory plan needs every trained parameter's shape (ParamCounts.from_shapes)")
        adapters = shape.adapters[index] if shape.adapters else {}
        a, h = sharded_numels({**counts.shapes, **adapters}, layout)
        allocated, held = allocated + a, held + h
        # LoRA: FSDP shards each adapter like any parameter; only they have gradients and moments.
        ta, th = sharded_numels(adapters, layout) if adapters else (a, h)
        trainable_allocated, trainable_held = trainable_allocated + ta, trainable_held + th
    return {
        "master weights": 4 * allocated,
        "AdamW moments": 8 * trainable_held,
        "gradients": 4 * trainable_allocated,
        "weight copy": 4 * trainable_held,
    }
