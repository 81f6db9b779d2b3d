"""Data parallelism of the trainable transformer: replicate (all-reduce), FSDP2 or HSDP, same code on CPU and GPU.

FSDP and HSDP use `fully_shard` on every transformer block and then on the root, over a 1-D mesh
(FSDP: shard over all ranks) or a 2-D mesh (HSDP: shard within groups of `shard_group_size` ranks,
replicate across groups), with the configured parameter and reduction dtypes. The blocks cast their
inputs to the compute dtype; the root does not, so the timestep reaches the transformer in
`grpo.trajectory_dtype`. Gradients of sharded models are reduced by FSDP itself; replicated models
average theirs with one all-reduce.
"""

from __future__ import annotations

import warnings

import torch

from videogrpo.config import Config
from videogrpo.errors import ConfigError
from videogrpo.models.wan import DTYPES
from videogrpo.parallel import process_groups

FAKE_BACKEND = "fake"
"""torch's fake process group (torch.testing._internal.distributed.fake_pg): a world of any size in one process
whose collectives move no data; `videogrpo simulate` builds the recipes' meshes on it."""


VIEW_OUTPUT_WARNING = r"FSDP2-wrapped module \(\w+\) returned a view tensor"
"""torch's warning about a sharded module whose output is a view (see fully_shard_model: harmless here)."""


def backend_override(names: tuple[str, ...], backend: str) -> dict:
    """init_device_mesh's backend_override: every named dimension's groups with `group_options` (none for fake)."""
    options = group_options(backend)
    return {} if options is None else {name: (None, options) for name in names}


def group_options(backend: str):
    """Options of a mesh's process groups: the default group's timeout (process_groups.PROCESS_GROUP_TIMEOUT_S).

    init_device_mesh makes its groups with torch's default timeout (10 min for NCCL, 30 for gloo) unless
    options carry one, and FSDP's all-gathers and reduce-scatters run on those groups, not the default one.
    """
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=process_groups.PROCESS_GROUP_TIMEOUT_S)
    if backend == FAKE_BACKEND:
        return None  # torch's fake group takes options of its own type, and its collectives never wait
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return options
    return torch._C._distributed_c10d.Backend.Options(backend, timeout)


def device_mesh(cfg: Config, world: int, device_type: str):
    from torch.distributed.device_mesh import init_device_mesh

    mode = cfg.parallel.data_parallel
    if mode == "fsdp":
        return init_device_mesh(
            device_type,
            (world,),
            mesh_dim_names=("shard",),
            backend_override=backend_override(("shard",), cfg.parallel.backend),
        )
    group = cfg.parallel.shard_group_size
    if world % group:
        raise ConfigError(f"parallel.shard_group_size = {group}: must divide the world size {world}")
    return init_device_mesh(
        device_type,
        (world // group, group),
        mesh_dim_names=("replicate", "shard"),
        backend_override=backend_override(("replicate", "shard"), cfg.parallel.backend),
    )


def apply_data_parallel(model: torch.nn.Module, cfg: Config, world: int, device: torch.device) -> torch.nn.Module:
    """Shard `model` in place for fsdp/hsdp (a no-op for replicate, and for a world of one without a process
    group; under torchrun one process of a sharded layout has one: FSDP2 on one GPU, as the GPU tier runs)."""
    import torch.distributed as dist

    mode = cfg.parallel.data_parallel
    if mode == "replicate" or (world == 1 and not dist.is_initialized()):
        return model
    mesh = device_mesh(cfg, world, device.type)
    return fully_shard_model(model, mesh, DTYPES[cfg.parallel.param_dtype], DTYPES[cfg.parallel.reduce_dtype])


def fully_shard_model(
    model: torch.nn.Module, mesh, param_dtype: torch.dtype, reduce_dtype: torch.dtype
) -> torch.nn.Module:
    """FSDP2 over `mesh`: every block, then the root (also TP x FSDP's second step, over its "dp" sub-mesh)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # The transformer's output is a view (Wan unpatchifies with reshape and permute), and FSDP2 warns at every
    # forward that an in-place op on it would silently skip the pre-backward all-gather. None is made: velocity()
    # casts or combines it out of place and nothing writes into it, which tests/test_trainer.py's FSDP run guards
    # (an in-place op would make its gradients differ from replicate's, or fail). So the warning says nothing here.
    warnings.filterwarnings("ignore", message=VIEW_OUTPUT_WARNING, category=UserWarning)
    dtypes = dict(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy(**dtypes))
    # The root takes its inputs as the caller made them: the caller (WanTI2V.velocity) already hands over
    # hidden states and text embeddings in the compute dtype, and the timestep in grpo.trajectory_dtype,
    # which casting the root's inputs to param_dtype would silently turn to bf16 (937.5 -> 936).
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(**dtypes, cast_forward_inputs=False))
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def reduce_gradients(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
    """Average gradients over ranks where FSDP has not already done it."""
    if not is_sharded(model):
        process_groups.average_gradients(params)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP
        norm = norm.full_tensor()
    return float(norm)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered, on CPU (collective: every rank calls it; all receive it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def trained_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that require gradients (under LoRA: the adapters) gathered whole on CPU, by name; the frozen
    ones are neither gathered nor copied (collective: every rank calls it; on a sharded model rank 0 alone receives
    them, as torch's full state dict offloaded to CPU hands them out)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)


def describe_layout(model: torch.nn.Module) -> dict:
    """Where the trainable parameters live: their dtype, and for sharded models the mesh and this rank's share.

    Logged at the start of training and kept with the final weights, so a silent fallback to an
    unsharded model, or master weights in a low precision, are visible and testable.
    """
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.requires_grad]
    sharded = [p for p in params if isinstance(p, DTensor)]
    layout = {
        "parameters": len(params),
        "sharded": len(sharded),
        "dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in params}),
    }
    if frozen := [p for p in model.parameters() if not p.requires_grad]:  # LoRA: adapters trained, the base frozen
        layout.update(trainable_numel=sum(p.numel() for p in params), frozen_numel=sum(p.numel() for p in frozen))
    if sharded:
        # The widest mesh: under TP x FSDP the replicated parameters live on the "dp" sub-mesh, the TP shards on both.
        mesh = max((p.device_mesh for p in sharded), key=lambda m: m.ndim)
        layout.update(
            mesh_shape=list(mesh.shape),
            mesh_dims=list(mesh.mesh_dim_names or ()),
            placements=sorted({str(p.placements) for p in sharded}),
            local_fraction=sum(p.to_local().numel() for p in sharded) / sum(p.numel() for p in sharded),
        )
    return layout


def compile_blocks(model: torch.nn.Module) -> None:
    """torch.compile each transformer block (GPU recipes; checked by preflight)."""
    for block in model.blocks:
        block.compile()
