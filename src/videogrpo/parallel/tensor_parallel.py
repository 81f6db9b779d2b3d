"""Tensor parallelism of a Wan transformer (docs/reference-system.md#a14b), and TP x FSDP over a ("dp", "tp") mesh.

Per block, in self- (attn1) and cross-attention (attn2), to_q/to_k/to_v are split column-wise (each rank
owns heads / TP whole heads) and to_out.0 row-wise (its partial sums all-reduced); the feed-forward's
net.0.proj is column-wise and net.2 row-wise. Everything else (embedders, the other norms, scale-shift
tables, proj_out) is replicated: every TP rank holds and updates the same copy, and since the activations
those parameters see are replicated, so are their gradients. Wan's Q/K RMSNorm normalises over all heads,
so a rank cannot normalise its heads alone: `HeadShardedRMSNorm` all-reduces the float32 sum of squares.

The order is fixed: TP first, then FSDP2 (per block, then the root) over the "dp" sub-mesh, so FSDP
shards the TP shards (2-D parameters) and the replicated parameters over the data replicas only.
Ranks map onto the mesh row-major: dp_rank = rank // tp, tp_rank = rank % tp, so TP peers are
neighbours ({0, 1}, {2, 3}, ...) and, on GPUs, share a node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from videogrpo.config.checks import tensor_parallel_problems
from videogrpo.errors import ConfigError


@dataclass(frozen=True)
class MeshDims:
    """The dp x tp arithmetic, validated once (`mesh_dims`)."""

    world: int
    tp: int

    @property
    def dp(self) -> int:
        return self.world // self.tp

    def dp_rank(self, rank: int) -> int:
        return rank // self.tp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp


def mesh_dims(world: int, tensor_parallel: int, data_parallel: str) -> MeshDims:
    """The mesh of a TP run, or a ConfigError naming the numbers that break it (config.tensor_parallel_problems)."""
    if found := tensor_parallel_problems(world, tensor_parallel, data_parallel):
        raise ConfigError(found[0])
    return MeshDims(world, tensor_parallel)


def device_mesh(dims: MeshDims, device_type: str, backend: str):
    """The 2-D ("dp", "tp") mesh; every group waits as long as the default one (parallelize.group_options)."""
    from torch.distributed.device_mesh import init_device_mesh

    from videogrpo.parallel.fsdp import backend_override

    return init_device_mesh(
        device_type,
        (dims.dp, dims.tp),
        mesh_dim_names=("dp", "tp"),
        backend_override=backend_override(("dp", "tp"), backend),
    )


def check_model(model: torch.nn.Module, tp: int) -> None:
    """Refuse what this TP plan cannot split exactly: fused projections, image K/V, sizes not divisible by tp."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    for i, block in enumerate(model.blocks):
        for name in ("attn1", "attn2"):
            attn = getattr(block, name)
            where = f"blocks.{i}.{name}"
            if getattr(attn, "fused_projections", False):
                raise ConfigError(
                    f"{where}: fused Q/K/V projections cannot be split column-wise by tensor_parallel = {tp}; "
                    "unfuse them (unfuse_qkv_projections) before tensor parallel"
                )
            if attn.add_k_proj is not None:
                raise ConfigError(
                    f"{where}: image K/V projections (added_kv_proj_dim = {attn.added_kv_proj_dim}) are not "
                    f"split by tensor_parallel = {tp}; the Wan2.2 I2V transformers have none"
                )
            if not isinstance(attn.processor, WanAttnProcessor):
                raise ConfigError(
                    f"{where}: attention processor {type(attn.processor).__name__} is not WanAttnProcessor, "
                    "whose reshape by attn.heads this plan relies on"
                )
            if attn.heads % tp:
                raise ConfigError(
                    f"{where}: {attn.heads} attention heads are not divisible by tensor_parallel = {tp}; "
                    "choose a tensor_parallel that divides the head count"
                )
            if not isinstance(attn.norm_q, torch.nn.RMSNorm) or not isinstance(attn.norm_k, torch.nn.RMSNorm):
                raise ConfigError(f"{where}: expected RMSNorm Q/K norms across heads, found {type(attn.norm_q)}")
        ffn = block.ffn.net[0].proj.out_features
        if ffn % tp:
            raise ConfigError(
                f"blocks.{i}.ffn: feed-forward size {ffn} is not divisible by tensor_parallel = {tp}; "
                "choose a tensor_parallel that divides it"
            )


@torch.compiler.disable
def sharded_rms_norm(x: torch.Tensor, weight: torch.Tensor, full_dim: int, eps: float, group) -> torch.Tensor:
    """RMSNorm over the last dimension of a tensor whose last dimension is split over `group`.

    As torch's RMSNorm: float32 arithmetic, weight applied in float32, result in x's dtype. The sum of
    squares is all-reduced with a differentiable SUM (its backward sums the peers' gradients, since each
    peer's output depends on every peer's slice). Kept out of compiled graphs: the collective breaks them.
    """
    import warnings

    from torch.distributed.nn.functional import all_reduce

    x32 = x.float()
    # Not a DTensor Partial -> Replicate: DTensor takes a replicated tensor's gradient to be the same on every
    # rank, but here each rank's gradient covers only its own heads and the peers' parts must be summed.
    # torch.distributed.nn's all_reduce sums them in backward (the test checks the input gradients); its
    # deprecation warning points to functional collectives, whose all_reduce is not differentiable.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        squares = all_reduce(x32.pow(2).sum(dim=-1, keepdim=True), group=group)
    return (x32 * torch.rsqrt(squares / full_dim + eps) * weight).type_as(x)


class HeadShardedRMSNorm(torch.nn.Module):
    """Wan's Q/K norm (RMSNorm across all heads) for a rank that holds heads / TP of them.

    `weight` is a DTensor sharded like the projection's output (Shard(0) over the TP mesh), so the state-dict
    key (`...norm_q.weight`) and full shape are those of the unsharded model.
    """

    def __init__(self, norm: torch.nn.RMSNorm, tp_mesh):
        from torch.distributed.tensor import Shard, distribute_tensor

        super().__init__()
        (self.full_dim,) = norm.normalized_shape
        self.eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
        self.group = tp_mesh.get_group()
        self.weight = torch.nn.Parameter(distribute_tensor(norm.weight.detach(), tp_mesh, [Shard(0)]))

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Disabled as a whole, not only sharded_rms_norm: dynamo traced `to_local` and then handed the disabled
        # function the DTensor itself (torch 2.13, blocks compiled: "mixed torch.Tensor and DTensor").
        weight = self.weight.to_local() if hasattr(self.weight, "to_local") else self.weight
        return sharded_rms_norm(x, weight, self.full_dim, self.eps, self.group)


def block_plan() -> dict:
    """The TP plan of one WanTransformerBlock (module path -> style), docs/reference-system.md#a14b: the table of
    shard_layout, which the memory plan counts with."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from videogrpo.parallel.shard_layout import COLWISE, ROWWISE

    return {**{path: ColwiseParallel() for path in COLWISE}, **{path: RowwiseParallel() for path in ROWWISE}}


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh) -> torch.nn.Module:
    """Split every block of a WanTransformer3DModel over `tp_mesh` in place (checked first: `check_model`)."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    check_model(model, tp)
    for block in model.blocks:
        parallelize_module(block, tp_mesh, block_plan())
        for attn in (block.attn1, block.attn2):
            attn.norm_q = HeadShardedRMSNorm(attn.norm_q, tp_mesh)
            attn.norm_k = HeadShardedRMSNorm(attn.norm_k, tp_mesh)
            # WanAttnProcessor unflattens Q/K/V into attn.heads heads: the local projection holds heads / tp.
            attn.heads //= tp
    return model


def parallelize_model(
    model: torch.nn.Module,
    dims: MeshDims,
    device_type: str,
    backend: str,
    data_parallel: str,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    mesh=None,
):
    """TP over "tp", then (data_parallel fsdp) FSDP2 over "dp": the one fixed order. Returns (model, mesh).
    `mesh`: one made before (both experts of a run share one), else a new one."""
    from videogrpo.parallel.fsdp import fully_shard_model

    mesh = mesh if mesh is not None else device_mesh(dims, device_type, backend)
    apply_tensor_parallel(model, mesh["tp"])
    if data_parallel == "fsdp":
        fully_shard_model(model, mesh["dp"], param_dtype, reduce_dtype)
    return model, mesh


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The global L2 norm of the gradients, whatever mix of meshes they live on (a float32 scalar tensor).

    Under TP x FSDP the TP shards are 2-D DTensors and the replicated parameters 1-D ("dp") ones; torch's
    clip_grad_norm_ stacks their norms into one tensor, which needs one mesh. Each mesh's norm is taken by
    DTensor (it sums a shard's squares over the mesh dimensions it is sharded on, never over replicas),
    then the meshes' norms are combined.
    """
    by_mesh: dict = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    total = torch.zeros((), dtype=torch.float32)
    for grads in by_mesh.values():
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total = total.to(norm.device) + norm.pow(2)
    return total.sqrt()


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients to a global norm of at most max_norm; returns the norm before clipping."""
    norm = float(grad_norm(params))
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm
