"""LoRA adapters as a LoRA run exports them (train.lora_rank > 0, docs/options.md#lora), and the trained transformer
they make.

Each trained transformer's folder of the export (`transformer`, and for I2V-A14B `transformer_2`) holds its
adapters in the file Diffusers' `load_lora_weights` loads (`ADAPTERS_FILE`: peft keys prefixed `transformer.`, the
LoRA config in the file's metadata); the high-noise expert's loads into a pipeline's `transformer`, the low-noise
expert's with `load_into_transformer_2=True`. With train.lora_export_merged the folder also holds the merged
transformer in the usual Diffusers layout (`config.json` and its weights), which then is the trained model.
"""

from __future__ import annotations

from pathlib import Path

import torch

ADAPTERS_FILE = "pytorch_lora_weights.safetensors"
"""Diffusers' LoRA weight name (`WanPipeline.save_lora_weights` writes it, `load_lora_weights` looks for it)."""


def holds_full_transformer(folder: Path) -> bool:
    """Whether an exported folder holds a whole transformer (a full fine-tuning, or the merged LoRA export)."""
    return (Path(folder) / "config.json").is_file()


def holds_adapters(folder: Path) -> bool:
    return (Path(folder) / ADAPTERS_FILE).is_file()


def fuse_adapters(transformer: torch.nn.Module, folder: Path) -> torch.nn.Module:
    """`transformer` with the adapters of `folder` fused into its weights and the LoRA layers removed (a plain
    Diffusers transformer again), loaded the way `WanPipeline.load_lora_weights` loads them."""
    from diffusers import WanPipeline

    state, metadata = WanPipeline.lora_state_dict(str(folder), weight_name=ADAPTERS_FILE, return_lora_metadata=True)
    WanPipeline.load_lora_into_transformer(state, transformer=transformer, metadata=metadata)
    transformer.fuse_lora()
    transformer.unload_lora()
    return transformer


def load_trained_transformer(
    folder: Path, base_folder: Path, device: torch.device, attention_backend: str
) -> torch.nn.Module:
    """The trained transformer an exported folder stands for: the whole transformer it holds (a full fine-tuning, or
    a LoRA run's merged export), else the base pipeline's transformer `base_folder` with the folder's adapters
    fused. A folder with neither is refused, naming both files."""
    from videogrpo.errors import VideoGRPOError
    from videogrpo.models.wan import load_transformer

    folder = Path(folder)
    if holds_full_transformer(folder):
        return load_transformer(folder, device, attention_backend)
    if not holds_adapters(folder):
        raise VideoGRPOError(
            f"{folder}: holds neither a transformer (config.json) nor LoRA adapters ({ADAPTERS_FILE}); rerun train "
            f"(snakemake --forcerun train)"
        )
    return fuse_adapters(load_transformer(base_folder, device, attention_backend), folder)
