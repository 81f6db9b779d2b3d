"""What the memory plan needs of a pipeline, and where it gets it: the trained transformers' parameters (every
parameter's shape, by name, so that each rank's shard follows from torch's own sharding arithmetic), the frozen
models' sizes and the VAE's compression; from a downloaded pipeline's safetensors headers and configs
(`ModelShape.from_model_dir`, preflight) or from configs on the meta device (`config_shapes`; `videogrpo plan` and
`simulate`). LoRA's adapters are added by `with_lora`.

May import: `grpo`, `models`, `artifacts` and the core modules.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from videogrpo.artifacts.weights import directory_numels, directory_shapes


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of the transformer: all, one block's, and those outside the blocks (the FSDP root's), and every
    parameter's shape by name (what a rank's shard of each is follows from it: parallel.shard_layout)."""

    total: int
    per_block: int
    outside_blocks: int
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_shapes(cls, shapes: dict[str, tuple[int, ...]]) -> ParamCounts:
        numels = {name: math.prod(shape) for name, shape in shapes.items()}
        per_block = sum(n for name, n in numels.items() if name.startswith("blocks.0."))
        outside = sum(n for name, n in numels.items() if not name.startswith("blocks."))
        return cls(sum(numels.values()), per_block, outside, dict(shapes))


def config_shapes(transformer_config: dict) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of a WanTransformer3DModel built from its config on the meta device (no memory)."""
    import torch
    from diffusers import WanTransformer3DModel

    keys = {k: v for k, v in transformer_config.items() if not k.startswith("_")}
    with torch.device("meta"):
        model = WanTransformer3DModel(**keys)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a pipeline: the transformer's config and parameters, the frozen models' sizes,
    the VAE's compression."""

    transformer: dict
    params: ParamCounts
    frozen_params: int
    """Text encoder and VAE parameters."""
    z_dim: int
    spatial: int
    temporal: int
    experts: tuple[ParamCounts, ...] = ()
    """Each trained expert's counts where a run trains several (two-expert models): the optimizer state sums
    them, while `params` (the largest) sizes the working sets, one expert running at a time. Empty: `params`."""
    adapters: tuple[dict[str, tuple[int, ...]], ...] = ()
    """LoRA (train.lora_rank > 0): each trained expert's adapter shapes, in `trained_counts`' order; the base is
    frozen, so gradients and AdamW moments are the adapters' only. Empty: full fine-tuning."""
    vae: dict = field(default_factory=dict, repr=False, compare=False)
    """The VAE's config (vae/config.json), whose decoder's peak the plan counts (preflight.working_sets). Empty:
    unknown (a simulation builds no frozen models), and the plan says the decoder is not counted."""

    @property
    def trained(self) -> int:
        """Parameters with float32 master weights: every trained expert's (under LoRA its base and adapters)."""
        return sum(e.total for e in self.trained_counts) + sum(math.prod(s) for a in self.adapters for s in a.values())

    @property
    def trainable(self) -> int:
        """Parameters with gradients and AdamW moments: every trained expert's (under LoRA its adapters only)."""
        if not self.adapters:
            return self.trained
        return sum(math.prod(s) for a in self.adapters for s in a.values())

    @property
    def trainable_per_block(self) -> int:
        """Parameters of one block with gradients (under LoRA its adapters only), of the largest expert."""
        if not self.adapters:
            return self.params.per_block
        return max(sum(math.prod(s) for n, s in a.items() if n.startswith("blocks.0.")) for a in self.adapters)

    @property
    def trained_counts(self) -> tuple[ParamCounts, ...]:
        return self.experts or (self.params,)

    @classmethod
    def from_model_dir(cls, model_dir: Path, transformers: tuple[str, ...] = ("transformer",)) -> ModelShape:
        """The shape of a pipeline directory whose trained transformer folders are `transformers`
        (trained_transformers: `transformer`, or an I2V model's experts)."""
        counts = [ParamCounts.from_shapes(directory_shapes(model_dir / name)) for name in transformers]
        largest = max(range(len(counts)), key=lambda i: counts[i].total)
        transformer = json.loads((model_dir / transformers[largest] / "config.json").read_text())
        vae = json.loads((model_dir / "vae" / "config.json").read_text())
        frozen = sum(sum(directory_numels(model_dir / part).values()) for part in ("text_encoder", "vae"))
        return cls(
            transformer,
            counts[largest],
            frozen,
            vae["z_dim"],
            vae.get("scale_factor_spatial", 16),
            vae.get("scale_factor_temporal", 4),
            tuple(counts) if len(counts) > 1 else (),
            vae=vae,
        )

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        return (self.z_dim, (frames - 1) // self.temporal + 1, height // self.spatial, width // self.spatial)


def with_lora(shape: ModelShape, rank: int, targets) -> ModelShape:
    """`shape` with LoRA adapters of `rank` on the layers `targets` names (train.lora_targets) of every trained
    expert (grpo.lora.adapter_shapes)."""
    import dataclasses

    from videogrpo.grpo.lora import adapter_shapes

    return dataclasses.replace(
        shape, adapters=tuple(adapter_shapes(c.shapes, rank, targets) for c in shape.trained_counts)
    )
