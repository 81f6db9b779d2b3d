"""Sampling of evaluation videos, one path for both model kinds (the matrix's cells, the held-out check among them).

The kinds differ in four facts, all kept here so that the stages differ only in what they select:
- the model: `ti2v` is WanTI2V (one transformer), `i2v_a14b` WanI2VA14B (two experts, routed in its
  `velocity` by the model's boundary; the weights handed to it are the experts mapping);
- the condition: TI2V's is the first frame's latent [B, C, 1, h, w]; I2V's the 20-channel mask and
  first-frame latent [B, 20, F, h, w], fed beside the noisy latent (it needs the frame count to encode);
- pinning: TI2V sets latent frame 0 to its condition before the first step and after every step; I2V
  pins nothing, latent frame 0 is denoised like the others (docs/reference-system.md#a14b);
- the trained model: the base pipeline with the exported `transformer` (TI2V), or with each exported
  expert folder (`transformer`, `transformer_2`) substituted for the base expert (I2V); a LoRA run's folder
  without merged weights stands for the base transformer with its adapters fused (models/lora.py).
Evaluation takes no log-probabilities, so the rollout's frame mask (0 on TI2V's pinned frame, all ones
for I2V) plays no part here.

`sample_latents` runs a Gaussian transition of training (`SDE`: `grpo.samplers.transition`, the one the
rollout steps with), training's DPM-Solver (`Solver`) or a diffusers ODE scheduler (`ODE`: the steps of
diffusers' Wan pipelines), the latent in float32 between steps; the three are `grpo.denoise`'s, which
validation during training samples with too.
The weights a stage substitutes are inputs of its StageRun, so their digests were checked against the train
manifest before any is read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from videogrpo import models
from videogrpo.errors import ConfigError
from videogrpo.grpo.denoise import ODE as ODE  # re-exported: generation samples through this module
from videogrpo.grpo.denoise import SDE as SDE
from videogrpo.grpo.denoise import Solver as Solver
from videogrpo.grpo.denoise import sample_latents as sample_latents
from videogrpo.models import lora
from videogrpo.models.i2v import EXPERT_FOLDERS, WanI2VA14B, check_expert
from videogrpo.models.wan import WanTI2V


def is_i2v(model) -> bool:
    return isinstance(model, WanI2VA14B)


def load_model(cfg, model_dir: Path, device: torch.device):
    """The base model of `model.kind`; an I2V base always has both experts (the evaluated pipeline's)."""
    if cfg.model.kind == "i2v_a14b":
        return WanI2VA14B.from_config(model_dir, device, cfg)
    return WanTI2V.from_config(model_dir, device, cfg)


def base_weights(model):
    """What `velocity` takes for the base model: its transformer (TI2V) or its experts mapping (I2V)."""
    return dict(model.experts) if is_i2v(model) else model.transformer


def eval_mode(weights):
    for module in weights.values() if isinstance(weights, Mapping) else [weights]:
        module.eval()
    return weights


def exported_folders(cfg, final_dir: Path) -> dict[str, Path]:
    """Expert name -> the folder of train's export that replaces that base expert (models.trained_folders:
    one per trained expert), each present; a folder of an expert the run did not train is refused (the
    export and the config disagree, and which weights are evaluated must not depend on a stray folder)."""
    setting = cfg.train.experts
    try:
        trained = models.trained_folders(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    expert_of = {folder: name for name, folder in EXPERT_FOLDERS.items()}
    folders = {expert_of[folder]: final_dir / folder for folder in trained}
    if missing := [str(path) for path in folders.values() if not path.is_dir()]:
        raise ConfigError(
            f"train.experts = {setting!r}: the export {final_dir} lacks {missing}; rerun train "
            f"(snakemake --forcerun train) or set train.experts to the experts the run trained"
        )
    if extra := [
        folder for folder in EXPERT_FOLDERS.values() if folder not in trained and (final_dir / folder).exists()
    ]:
        raise ConfigError(
            f"train.experts = {setting!r}, but the export {final_dir} also holds {extra}; set train.experts to "
            f"the experts the run trained"
        )
    return folders


def substitute_experts(model: WanI2VA14B, folders: Mapping[str, Path], attention_backend: str) -> dict:
    """The I2V model's experts with `folders` (expert name -> Diffusers folder) in place of the base ones, on
    the model itself: each base expert is let go before its replacement loads, since two A14B experts in
    float32 are 112 GB. The base experts are therefore gone afterwards (a cell holds one model: a trained cell
    loads the base pipeline and substitutes its experts once)."""
    for name, folder in folders.items():
        if name not in model.experts:
            raise ConfigError(f"{folder}: the model has no {name}-noise expert to replace")
        model.experts[name] = None
        setattr(model, EXPERT_FOLDERS[name], None)
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
        # A LoRA run's folder holds adapters: the base expert from the pipeline, the adapters fused (models/lora.py).
        base = model.model_dir / EXPERT_FOLDERS[name]
        expert = lora.load_trained_transformer(folder, base, model.device, attention_backend)
        check_expert(folder, expert.config, model.vae.config.z_dim)
        model.experts[name] = expert
        setattr(model, EXPERT_FOLDERS[name], expert)
    return dict(model.experts)


def trained_weights(cfg, model, final_dir: Path):
    """The trained model's weights from train's export `final_dir`: its transformer (TI2V), or the base
    experts with the exported expert folder(s) substituted (I2V; `train.experts` says which)."""
    if is_i2v(model):
        return eval_mode(substitute_experts(model, exported_folders(cfg, final_dir), cfg.parallel.attention_backend))
    return trained_transformer(final_dir / "transformer", model.model_dir, model.device, cfg).eval()


def trained_transformer(folder: Path, model_dir: Path, device: torch.device, cfg) -> torch.nn.Module:
    """TI2V's trained transformer from an exported folder: the whole transformer it holds, or (a LoRA run's export
    without the merged weights) the base pipeline's `transformer` with the folder's adapters fused."""
    return lora.load_trained_transformer(
        folder, Path(model_dir) / "transformer", device, cfg.parallel.attention_backend
    )


def encode(model, prompts: list[str], first_frames: list[Path], height: int, width: int, num_frames: int):
    """(prompt embeddings, condition) of a batch, as the model's velocity takes them."""
    if is_i2v(model):
        return model.encode_conditions(prompts, first_frames, height, width, num_frames)
    return model.encode_conditions(prompts, first_frames, height, width)
