"""Loading a Wan2.2 TI2V Diffusers pipeline directory and the operations GRPO needs from it.

Rollouts and training call the transformer directly (not the pipeline's __call__), since every
denoising transition must be recorded and replayed. Conventions follow diffusers' Wan pipelines
with `expand_timesteps=True`: latents are normalised with the VAE's latents_mean/std, latent frame 0
holds the VAE-encoded first frame at timestep 0, and the timestep is sigma x 1000 per token.

Precision (docs/reference-system.md#grpo): the transformer is loaded in float32, since its parameters are the
master weights AdamW updates; the compute dtype (`parallel.param_dtype`) is applied by FSDP2's
mixed-precision policy for sharded models and by autocast otherwise. The rollout trajectory and the
timestep handed to the transformer are kept in the trajectory dtype (`grpo.trajectory_dtype`): the
reference keeps both in bf16, so 937.5 reaches the transformer as 936. The frozen text encoder and VAE
load in `model.frozen_dtype` (bf16 in the recipes); they compute in it and hand float32 results on.
Prompt embeddings are cached on CPU, bounded in bytes (`prompt_cache.PromptCache`). Where the frozen
models live between uses is the trainer's offload schedule (`grpo.offload`), not this module's.

The flow shift of the sigma schedule is the model's (`scheduler_flow_shift`): training and the matrix's cells
read it with one function; `grpo.shift` overrides it for training only (`flow_shift`), when set.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from videogrpo.errors import ConfigError
from videogrpo.models.prompt_cache import PromptCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NUM_TRAIN_TIMESTEPS = 1000
DEFAULT_FLOW_SHIFT = 5.0
"""The reference's flow shift where the model's scheduler config names none."""


def scheduler_flow_shift(model_dir: str | Path) -> tuple[float, str]:
    """The model's flow shift and where it came from: `scheduler/scheduler_config.json`'s `flow_shift`,
    else its `shift`, else 5.0 (the reference's rule; the UniPC configs of Wan's Diffusers snapshots name
    `flow_shift`, diffusers' flow-matching Euler scheduler `shift`)."""
    path = Path(model_dir) / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        return DEFAULT_FLOW_SHIFT, f"the reference's default: no {path}"
    config = json.loads(path.read_text())
    for key in ("flow_shift", "shift"):
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{path}: {key} = {value!r} is not a positive number; fix the model's scheduler config")
        return float(value), f"from {path}: {key}"
    return DEFAULT_FLOW_SHIFT, f"the reference's default: no flow_shift or shift in {path}"


def flow_shift(cfg, model_dir: str | Path) -> tuple[float, str]:
    """The flow shift a run samples with, and its source: grpo.shift when set, else the model's."""
    if cfg.grpo.shift is not None:
        return float(cfg.grpo.shift), "grpo.shift override"
    return scheduler_flow_shift(model_dir)


def trajectory_dtype(setting: str, compute_dtype: str) -> torch.dtype:
    """grpo.trajectory_dtype resolved: `compute` follows parallel.param_dtype (the reference with bf16)."""
    return DTYPES[compute_dtype if setting == "compute" else setting]


def clean_prompt(text: str) -> str:
    """The Wan pipelines' prompt cleaning: ftfy, HTML unescaped twice, whitespace collapsed, stripped."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text)))
    return re.sub(r"\s+", " ", text).strip()


def set_attention_backend(model: torch.nn.Module, name: str) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName

    known = {b.value for b in AttentionBackendName}
    if name not in known:
        raise ConfigError(f"parallel.attention_backend = {name!r}: unknown to diffusers; known: {sorted(known)}")
    model.set_attention_backend(name)


@dataclass
class LatentGeometry:
    channels: int
    frames: int
    height: int
    width: int
    patch: tuple[int, int, int]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.channels, self.frames, self.height, self.width)


class WanTI2V:
    """The frozen parts (tokenizer, text encoder, VAE) and the trainable transformer of a TI2V pipeline."""

    pins_first_frame = True
    """Latent frame 0 is the clean image latent, re-pinned after every step and out of log-prob and KL."""

    def __init__(
        self,
        model_dir: str | Path,
        device: torch.device,
        compute_dtype: str = "float32",
        attention_backend: str = "native",
        max_text_tokens: int = 512,
        kind: str = "ti2v",
        trajectory: str = "compute",
        frozen_dtype: str = "float32",
        prompt_cache_bytes: int = 1 << 30,
        frozen_device: torch.device | None = None,
        condition_dtype: str = "bfloat16",
    ):
        """`frozen_device`: where the text encoder and VAE are loaded (default `device`; CPU when offloaded);
        `condition_dtype`: the first-frame condition's precision (model.condition_dtype)."""
        if kind != "ti2v":
            raise ConfigError(f"model.kind = {kind!r}: only 'ti2v' (Wan2.2 TI2V-5B layout) is implemented so far")
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel

        model_dir = Path(model_dir)
        self.model_dir = model_dir
        self.device = device
        self.compute_dtype = DTYPES[compute_dtype]
        self.trajectory_dtype = trajectory_dtype(trajectory, compute_dtype)
        self.max_text_tokens = max_text_tokens
        self.condition_dtype = condition_dtype
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir / "tokenizer")
        self.frozen_dtype = DTYPES[frozen_dtype]
        frozen_device = device if frozen_device is None else frozen_device
        self.text_encoder = (
            UMT5EncoderModel.from_pretrained(model_dir / "text_encoder", dtype=self.frozen_dtype)
            .to(frozen_device)
            .eval()
        )
        self.vae = (
            AutoencoderKLWan.from_pretrained(model_dir / "vae", torch_dtype=self.frozen_dtype).to(frozen_device).eval()
        )
        self.transformer = load_transformer(model_dir / "transformer", device, attention_backend)
        for frozen in (self.text_encoder, self.vae):
            frozen.requires_grad_(False)
        vae_cfg = self.vae.config
        shape = (1, vae_cfg.z_dim, 1, 1, 1)
        self.latents_mean = torch.tensor(vae_cfg.latents_mean, dtype=torch.float32, device=device).view(shape)
        self.latents_std = torch.tensor(vae_cfg.latents_std, dtype=torch.float32, device=device).view(shape)
        self.spatial = vae_cfg.scale_factor_spatial
        self.temporal = vae_cfg.scale_factor_temporal
        self._prompt_cache = PromptCache(prompt_cache_bytes)

    @classmethod
    def from_config(
        cls, model_dir: str | Path, device: torch.device, cfg, frozen_device: torch.device | None = None
    ) -> WanTI2V:
        """The model as a run's config sets it up (dtypes, attention, prompt length, prompt cache)."""
        return cls(
            model_dir,
            device,
            cfg.parallel.param_dtype,
            cfg.parallel.attention_backend,
            cfg.model.max_text_tokens,
            cfg.model.kind,
            cfg.grpo.trajectory_dtype,
            cfg.model.frozen_dtype,
            cfg.model.prompt_cache_bytes,
            frozen_device,
            cfg.model.condition_dtype,
        )

    @classmethod
    def without_frozen_models(cls, transformer: torch.nn.Module, device: torch.device, cfg) -> WanTI2V:
        """The model around a transformer built elsewhere, with no tokenizer, text encoder or VAE: `velocity` and what
        rollouts read (dtypes, pinning) as `from_config` sets them; encoding and decoding are unavailable. What
        `videogrpo simulate` drives on fake tensors at the real shapes."""
        model = cls.__new__(cls)
        model.device = device
        model.compute_dtype = DTYPES[cfg.parallel.param_dtype]
        model.trajectory_dtype = trajectory_dtype(cfg.grpo.trajectory_dtype, cfg.parallel.param_dtype)
        model.transformer = transformer
        return model

    @property
    def trainable(self) -> dict[str, torch.nn.Module]:
        """The trainable transformer(s) by name, as training wraps and checkpoints them."""
        return {"transformer": self.transformer}

    def geometry(self, num_frames: int, height: int, width: int) -> LatentGeometry:
        return LatentGeometry(
            self.vae.config.z_dim,
            (num_frames - 1) // self.temporal + 1,
            height // self.spatial,
            width // self.spatial,
            tuple(self.transformer.config.patch_size),
        )

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], cached: bool = True) -> torch.Tensor:
        """UMT5 embeddings [B, L, D] of the cleaned prompts, zero beyond each prompt's tokens (as diffusers' Wan
        pipelines do), in the compute dtype, on the compute device. `cached=False` neither reads nor fills the
        prompt cache (validation's held-out prompts must not evict training's)."""
        prompts = [clean_prompt(p) for p in prompts]
        cache = self._prompt_cache if cached else PromptCache(0)
        found = {p: hit.to(self.device) for p in dict.fromkeys(prompts) if (hit := cache.get(p)) is not None}
        missing = [p for p in dict.fromkeys(prompts) if p not in found]
        if missing:
            tokens = self.tokenizer(
                missing,
                padding="max_length",
                max_length=self.max_text_tokens,
                truncation=True,
                add_special_tokens=True,
                return_tensors="pt",
            )
            ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
            hidden = self.text_encoder(ids, mask).last_hidden_state.float()
            hidden = hidden * mask.unsqueeze(-1)
            for prompt, embeds in zip(missing, hidden):
                found[prompt] = embeds
                cache.put(prompt, embeds)
        return torch.stack([found[p] for p in prompts]).to(self.compute_dtype)

    @torch.no_grad()
    def encode_first_frames(self, images: np.ndarray) -> torch.Tensor:
        """Normalised latent of each first frame, [B, C, 1, h, w] float32 holding `condition_dtype` values (uint8
        images [B, H, W, 3] in)."""
        pixels = first_frame_pixels(images, self.device, self.condition_dtype).unsqueeze(2)
        latents = self.vae.encode(pixels.to(self.frozen_dtype)).latent_dist.mode()
        return normalise_condition(latents, self.latents_mean, self.latents_std, self.condition_dtype, divide=True)

    def encode_conditions(
        self,
        prompts: list[str],
        first_frames: list[Path],
        height: int,
        width: int,
        num_frames: int | None = None,
        cached: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt embeddings, first-frame latents) of a batch: what every rollout is conditioned on. (`num_frames`
        is the I2V model's: TI2V's condition is latent frame 0 whatever the length; `cached`: encode_prompts'.)"""
        embeds = self.encode_prompts(prompts, cached)
        return embeds, self.encode_first_frames(load_first_frames(first_frames, height, width))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Decode normalised latents [B, C, F, h, w] (on any device) to uint8 video [B, F, H, W, 3]."""
        latents = latents.to(self.device).float() * self.latents_std + self.latents_mean
        video = self.vae.decode(latents.to(self.frozen_dtype)).sample.float()
        video = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return video.permute(0, 2, 3, 4, 1).cpu().numpy()

    def autocast(self, transformer: torch.nn.Module):
        """Compute-dtype context of a forward: FSDP2's policy casts sharded models itself; others autocast."""
        from torch.distributed.fsdp import FSDPModule

        if self.compute_dtype == torch.float32 or isinstance(transformer, FSDPModule):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def velocity(
        self,
        transformer: torch.nn.Module,
        x: torch.Tensor,
        sigma: float,
        embeds: torch.Tensor,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """Flow velocity (float32) at noise level sigma; latent frame 0 gets timestep 0 (the clean condition).

        Classifier-free guidance only when the scale is > 1, with zero text embeddings as the
        unconditional branch (the reference's rule).
        """
        batch, _, frames, height, width = x.shape
        _, ph, pw = self.transformer.config.patch_size
        per_frame = (height // ph) * (width // pw)
        timestep = torch.full((batch, frames, per_frame), sigma * NUM_TRAIN_TIMESTEPS, device=x.device)
        timestep[:, 0] = 0.0
        timestep = timestep.flatten(1).to(self.trajectory_dtype)
        hidden = x.to(self.compute_dtype)
        with self.autocast(transformer):
            out = transformer(hidden_states=hidden, timestep=timestep, encoder_hidden_states=embeds, return_dict=False)[
                0
            ].float()
            if guidance_scale > 1.0:
                uncond = transformer(
                    hidden_states=hidden,
                    timestep=timestep,
                    encoder_hidden_states=torch.zeros_like(embeds),
                    return_dict=False,
                )[0].float()
                out = uncond + guidance_scale * (out - uncond)
        return out


def first_frame_pixels(images: np.ndarray, device: torch.device, condition_dtype: str) -> torch.Tensor:
    """uint8 frames [B, H, W, 3] as pixels [B, 3, H, W] in [-1, 1], scaled in the condition dtype: the reference
    scales in bf16 (uint8 -> bf16, / 127.5, - 1), diffusers in float32."""
    pixels = torch.from_numpy(np.ascontiguousarray(images)).to(device, DTYPES[condition_dtype])
    return pixels.permute(0, 3, 1, 2).div(127.5).sub(1.0)


def normalise_condition(
    latents: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, condition_dtype: str, divide: bool
) -> torch.Tensor:
    """The VAE's latents normalised by its latents mean and std, returned as float32. `bfloat16` (the reference):
    (latents - mean) x (1 / std) in the VAE's dtype, then rounded to bf16. `float32`: in float32, dividing by std
    (`divide`, diffusers' TI2V pipeline) or multiplying by its reciprocal (diffusers' I2V pipeline)."""
    if condition_dtype == "bfloat16":
        dtype = latents.dtype
        return ((latents - mean.to(dtype)) * (1.0 / std).to(dtype)).to(torch.bfloat16).float()
    latents = latents.float() - mean
    return latents / std if divide else latents * (1.0 / std)


def tile_decoding(vae, tile: int | None) -> None:
    """Have `vae` decode in overlapping `tile` x `tile` pixel tiles at a 3/4-tile stride, blended where they overlap
    (grpo.vae_tile_size; diffusers' `enable_tiling`); None: whole frames. The tiles are square for any frame size."""
    if tile is None:
        vae.disable_tiling()
        return
    vae.enable_tiling(tile, tile, tile * 3 // 4, tile * 3 // 4)


def load_transformer(path: Path, device: torch.device, attention_backend: str) -> torch.nn.Module:
    """A Wan transformer in float32 (master weights: compute dtypes are applied per forward)."""
    from diffusers import WanTransformer3DModel

    transformer = WanTransformer3DModel.from_pretrained(path, torch_dtype=torch.float32).to(device)
    set_attention_backend(transformer, attention_backend)
    return transformer


def load_first_frames(paths: list[Path], height: int, width: int) -> np.ndarray:
    """Read first-frame PNGs resized (Lanczos, as the reference) to the generation size, uint8 [B, H, W, 3]."""
    from PIL import Image

    frames = []
    for path in paths:
        with Image.open(path) as image:
            frames.append(np.asarray(image.convert("RGB").resize((width, height), Image.LANCZOS)))
    return np.stack(frames)
