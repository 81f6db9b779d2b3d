"""The trainable transformers of a run: TI2V's one, or I2V-A14B's experts (docs/reference-system.md#a14b), each wrapped
for its parallel layout with its own AdamW, stepped together.

One AdamW per expert, one learning rate set on all every update, one joint clipping norm over every
expert's gradients (the logged grad_norm is that norm before clipping). An expert that served no replayed
step of an update has no gradient (None, on every rank alike: the trained timesteps are seeded per update,
so every rank routes them the same way), and AdamW leaves it unchanged, moments and decay included, as
torch's AdamW skips parameters without a gradient.
With parallel.offload_optimizer each AdamW is `host_optimizer.HostAdamW`, which steps in host memory.

`policy` is what the model's `velocity` takes: the one wrapped transformer (TI2V), or the wrapped experts by
name (I2V, which routes each step to one of them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from videogrpo.config import Config
from videogrpo.grpo import host_optimizer, lora
from videogrpo.models.wan import DTYPES
from videogrpo.parallel import fsdp, tensor_parallel


def mesh_dims(cfg: Config, world: int) -> tensor_parallel.MeshDims | None:
    """The dp x tp arithmetic of a run under tensor parallel (which ranks are TP peers), else None."""
    if cfg.parallel.tensor_parallel > 1:
        return tensor_parallel.mesh_dims(world, cfg.parallel.tensor_parallel, cfg.parallel.data_parallel)
    return None


@dataclass
class Expert:
    name: str
    """`transformer` (TI2V), `high` or `low` (I2V-A14B)."""
    module: torch.nn.Module
    """The trainable transformer, wrapped for the run's layout (FSDP2, TP x FSDP2 or replicated)."""
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None = None
    """The frozen copy KL is measured against (grpo.kl_coeff > 0 only)."""


class Experts:
    """Every trainable transformer of the run, in a fixed order (high before low)."""

    def __init__(self, experts: list[Expert], routed: bool, mesh_dims: tensor_parallel.MeshDims | None = None):
        self.experts = experts
        self.routed = routed
        """Whether `policy` is a mapping by name (the I2V model's velocity routes each step)."""
        self.mesh_dims = mesh_dims
        """The dp x tp arithmetic under tensor parallel, else None."""

    @classmethod
    def build(cls, raw: dict[str, torch.nn.Module], routed: bool, cfg: Config, world: int, device: torch.device):
        """Wrap each raw transformer as the config says: gradient checkpointing, the frozen reference (KL > 0),
        compiled blocks, then TP x FSDP2 (tensor_parallel > 1) or the data-parallel layout."""
        dims = mesh_dims(cfg, world)
        experts, mesh = [], None
        for index, (name, module) in enumerate(raw.items()):
            if cfg.train.gradient_checkpointing:
                module.enable_gradient_checkpointing()
            reference = None
            # No reference model at KL weight 0 (all released recipes); frozen, its weights may be in the compute
            # dtype. Taken before sharding: it stays whole on every rank.
            if cfg.grpo.kl_coeff > 0:
                reference = copy.deepcopy(module).to(DTYPES[cfg.parallel.param_dtype]).eval()
                reference.requires_grad_(False)
            if lora.enabled(cfg):  # adapters before any sharding, the base frozen (grpo/lora.py)
                lora.add_adapters(module, cfg, index)
            if dims is not None:
                tensor_parallel.check_model(module, dims.tp)
                module, mesh = tensor_parallel.parallelize_model(
                    module,
                    dims,
                    device.type,
                    cfg.parallel.backend,
                    cfg.parallel.data_parallel,
                    DTYPES[cfg.parallel.param_dtype],
                    DTYPES[cfg.parallel.reduce_dtype],
                    mesh,
                )
                if cfg.parallel.compile:
                    fsdp.compile_blocks(module)
            else:
                if cfg.parallel.compile:
                    fsdp.compile_blocks(module)
                module = fsdp.apply_data_parallel(module, cfg, world, device)
            module.train()
            params = [p for p in module.parameters() if p.requires_grad]
            optimizer = host_optimizer.optimizer(params, cfg.train.lr, cfg.train.weight_decay, cfg.parallel)
            experts.append(Expert(name, module, params, optimizer, reference))
        return cls(experts, routed, dims)

    @property
    def policy(self):
        if self.routed:
            return {e.name: e.module for e in self.experts}
        return self.experts[0].module

    @property
    def reference(self):
        if self.experts[0].reference is None:
            return None
        if self.routed:
            return {e.name: e.reference for e in self.experts}
        return self.experts[0].reference

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for e in self.experts for p in e.params]

    def param_names(self) -> list[str]:
        """`params`' names, each under its expert's: `transformer.blocks.0...`, `high.blocks.0...`."""
        return [f"{e.name}.{n}" for e in self.experts for n, p in e.module.named_parameters() if p.requires_grad]

    def replicas(self, world: int) -> int:
        """Data replicas: the ranks, or under TP the ranks over the TP degree (TP peers hold one replica)."""
        return self.mesh_dims.dp if self.mesh_dims else world

    def tp_rank(self, rank: int) -> int:
        return self.mesh_dims.tp_rank(rank) if self.mesh_dims else 0

    def step(self, lr: float, max_norm: float) -> float:
        """Average what the layout has not, clip jointly, set the learning rate, step every AdamW, clear the
        gradients; returns the joint norm before clipping."""
        served = [e for e in self.experts if any(p.grad is not None for p in e.params)]
        for e in served:
            if self.mesh_dims is None:
                fsdp.reduce_gradients(e.module, e.params)
        params = [p for e in served for p in e.params]
        if self.mesh_dims is not None or len(self.experts) > 1:
            # Two experts or two meshes (TP x FSDP): torch's clip_grad_norm_ stacks norms of one mesh only.
            grad_norm = tensor_parallel.clip_grad_norm(params, max_norm)
        else:
            grad_norm = fsdp.clip_grad_norm(params, max_norm)
        for e in served:
            if isinstance(e.optimizer, host_optimizer.HostAdamW):
                e.optimizer.park_gradients()  # parallel.offload_gradients: the clipped gradients to the host
        for e in self.experts:
            for group in e.optimizer.param_groups:
                group["lr"] = lr
            e.optimizer.step()
            e.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def modules(self) -> dict[str, torch.nn.Module]:
        return {e.name: e.module for e in self.experts}

    def parts(self) -> dict:
        """checkpoint.Parts: each expert's module and its optimizer."""
        return {e.name: (e.module, e.optimizer) for e in self.experts}

    def layout(self) -> dict:
        layouts = {e.name: fsdp.describe_layout(e.module) for e in self.experts}
        return layouts[self.experts[0].name] if not self.routed else layouts

    def full_state_dicts(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every expert's parameters gathered on CPU (collective: every rank calls it)."""
        return {e.name: fsdp.full_state_dict(e.module) for e in self.experts}
