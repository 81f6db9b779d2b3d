"""A Wan2.2 I2V-A14B Diffusers pipeline directory: two experts, image-to-video conditioning
(docs/reference-system.md#a14b).

Experts. `transformer` denoises the high-noise steps, `transformer_2` the low-noise ones. The boundary is the
model's own: `boundary_ratio` in model_index.json (0.9 when null or absent), boundary timestep
int(ratio x 1000). A step goes to the high-noise expert when t >= boundary, t being the unrounded float
sigma x 1000 of the float32 sigma (the reference keeps its schedule in float32 and routes on
`sigma.item() * 1000`). `timestep_of` and `route` are the one rule rollout and replay both apply, to the
same stored sigma. `experts="high"` or `"low"` (the reference's train_experts) loads only that expert, and it
serves every step.

Conditioning. The transformer input has 36 channels: [noisy latent 16; mask 4; condition latent 16]. The
condition latent is the VAE mode of the video made of the first frame followed by num_frames - 1 zero
(mid-grey) frames, normalised by the VAE's latents mean/std, as diffusers' WanImageToVideoPipeline and the
reference build it: the causal VAE carries the first frame into every later latent frame, so these are
not zeros. The mask is 1 on the first pixel frame, that frame repeated 4 times (the temporal factor) and the
result reshaped to 4 x latent frames x h x w, i.e. 1 on all 4 channels of latent frame 0 and 0 elsewhere.
`encode_conditions` returns mask and latent concatenated, [B, 20, F, h, w], so a rollout carries one
tensor per sample as the TI2V path does. The timestep is one scalar per sample, in the trajectory dtype
(bf16 under bf16 compute, as the reference). Nothing is pinned: latent frame 0 is denoised like every other
frame and counts in log-prob and KL means, unlike TI2V. No image encoder is loaded or passed.

The frozen parts (tokenizer, UMT5, VAE, the prompt cache) behave exactly as TI2V's: the methods that use them
are WanTI2V's own, over the same attribute names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from videogrpo.errors import ConfigError
from videogrpo.models.prompt_cache import PromptCache
from videogrpo.models.wan import (
    DTYPES,
    NUM_TRAIN_TIMESTEPS,
    LatentGeometry,
    WanTI2V,
    first_frame_pixels,
    load_first_frames,
    load_transformer,
    normalise_condition,
    trajectory_dtype,
)

EXPERTS = ("high", "low")
"""Expert names: `high` is the pipeline's `transformer`, `low` its `transformer_2`."""
EXPERT_FOLDERS = {"high": "transformer", "low": "transformer_2"}
DEFAULT_BOUNDARY_RATIO = 0.9
"""The reference's boundary ratio where model_index.json names none."""
MASK_CHANNELS = 4


def boundary_of(model_dir: str | Path) -> tuple[float, int]:
    """(boundary_ratio, boundary timestep int(ratio x 1000)) from the model's model_index.json."""
    path = Path(model_dir) / "model_index.json"
    index = json.loads(path.read_text())
    ratio = index.get("boundary_ratio")
    if ratio is None:
        ratio = DEFAULT_BOUNDARY_RATIO
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"{path}: boundary_ratio = {ratio!r} is not in (0, 1]; fix the model's model_index.json")
    return float(ratio), int(ratio * NUM_TRAIN_TIMESTEPS)


def timestep_of(sigma: float) -> float:
    """t = sigma x 1000 of the float32 sigma, unrounded (a Python float): what routing compares and what the
    transformer receives (before its cast to the trajectory dtype)."""
    return float(np.float32(sigma)) * NUM_TRAIN_TIMESTEPS


def route(t: float, boundary: int, loaded: tuple[str, ...]) -> str:
    """The expert serving timestep t: with both loaded, `high` when t >= boundary else `low`; with one
    loaded (experts high or low), that one for every step."""
    if len(loaded) == 1:
        return loaded[0]
    return "high" if t >= boundary else "low"


def expert_schedule(sigmas, boundary: int, loaded: tuple[str, ...]) -> list[str]:
    """The expert of each denoising step i (sigmas[i] -> sigmas[i + 1]) of a schedule of T + 1 sigmas."""
    return [route(timestep_of(float(s)), boundary, loaded) for s in list(sigmas)[:-1]]


def first_frame_mask(num_frames: int, height: int, width: int, temporal: int) -> torch.Tensor:
    """The 4-channel I2V mask [1, temporal, latent frames, h, w] of latent size h x w: the pixel-frame mask
    (1 on frame 0) with frame 0 repeated `temporal` times, regrouped `temporal` frames per latent frame."""
    mask = torch.zeros(1, 1, num_frames, height, width)
    mask[:, :, 0] = 1
    mask = torch.cat([mask[:, :, :1].repeat_interleave(temporal, dim=2), mask[:, :, 1:]], dim=2)
    return mask.view(1, -1, temporal, height, width).transpose(1, 2)


def transformer_2_named(model_dir: Path) -> bool:
    """Whether the model has a low-noise expert: model_index.json names `transformer_2` and its folder exists."""
    entry = json.loads((model_dir / "model_index.json").read_text()).get("transformer_2")
    named = isinstance(entry, list) and len(entry) == 2 and None not in entry
    return named and (model_dir / "transformer_2").is_dir()


class WanI2VA14B:
    """Frozen tokenizer, text encoder and VAE, and the trainable expert(s) of a Wan2.2 I2V-A14B pipeline."""

    pins_first_frame = False
    """Nothing is pinned: latent frame 0 is denoised like the others and counts in log-prob and KL."""
    encode_prompts = WanTI2V.encode_prompts
    decode = WanTI2V.decode
    autocast = WanTI2V.autocast

    def __init__(
        self,
        model_dir: str | Path,
        device: torch.device,
        compute_dtype: str = "float32",
        attention_backend: str = "native",
        max_text_tokens: int = 512,
        kind: str = "i2v_a14b",
        trajectory: str = "compute",
        frozen_dtype: str = "float32",
        prompt_cache_bytes: int = 1 << 30,
        frozen_device: torch.device | None = None,
        experts: str = "both",
        condition_dtype: str = "bfloat16",
    ):
        """`experts`: `both`, or `high` / `low` to load only that expert (it then serves every step);
        `condition_dtype`: the first-frame condition's precision (model.condition_dtype)."""
        if kind != "i2v_a14b":
            raise ConfigError(f"model.kind = {kind!r}: WanI2VA14B loads the Wan2.2 I2V-A14B layout ('i2v_a14b')")
        if experts not in ("both", *EXPERTS):
            raise ConfigError(f"train.experts = {experts!r}: use both, high or low")
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel

        model_dir = Path(model_dir)
        self.model_dir = model_dir
        self.device = device
        self.compute_dtype = DTYPES[compute_dtype]
        self.trajectory_dtype = trajectory_dtype(trajectory, compute_dtype)
        self.max_text_tokens = max_text_tokens
        self.condition_dtype = condition_dtype
        self.boundary_ratio, self.boundary = boundary_of(model_dir)
        self.loaded = EXPERTS if experts == "both" else (experts,)
        if "low" in self.loaded and not transformer_2_named(model_dir):
            raise ConfigError(
                f"train.experts = {experts!r} needs the low-noise expert, but {model_dir} has no transformer_2 "
                "(model_index.json does not name it or its folder is missing); use train.experts: high or a "
                "two-expert I2V-A14B model"
            )
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
        for frozen in (self.text_encoder, self.vae):
            frozen.requires_grad_(False)
        self.experts: dict[str, torch.nn.Module] = {
            name: load_transformer(model_dir / EXPERT_FOLDERS[name], device, attention_backend) for name in self.loaded
        }
        self.transformer = self.experts.get("high")
        self.transformer_2 = self.experts.get("low")
        vae_cfg = self.vae.config
        for name, expert in self.experts.items():
            check_expert(model_dir / EXPERT_FOLDERS[name], expert.config, vae_cfg.z_dim)
        shape = (1, vae_cfg.z_dim, 1, 1, 1)
        self.latents_mean = torch.tensor(vae_cfg.latents_mean, dtype=torch.float32, device=device).view(shape)
        self.latents_std = torch.tensor(vae_cfg.latents_std, dtype=torch.float32, device=device).view(shape)
        self.spatial = vae_cfg.scale_factor_spatial
        self.temporal = vae_cfg.scale_factor_temporal
        self._prompt_cache = PromptCache(prompt_cache_bytes)

    @classmethod
    def from_config(
        cls,
        model_dir: str | Path,
        device: torch.device,
        cfg,
        frozen_device: torch.device | None = None,
        experts: str = "both",
    ) -> WanI2VA14B:
        """The model as a run's config sets it up (dtypes, attention, prompt length, prompt cache, experts)."""
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
            experts,
            cfg.model.condition_dtype,
        )

    @classmethod
    def without_frozen_models(
        cls,
        experts: dict[str, torch.nn.Module],
        device: torch.device,
        cfg,
        boundary_ratio: float = DEFAULT_BOUNDARY_RATIO,
    ) -> WanI2VA14B:
        """The model around experts built elsewhere (`high` and/or `low`), with no tokenizer, text encoder or VAE:
        `velocity`, routing and dtypes as `from_config` sets them (the boundary: `boundary_ratio`, the model's own
        being in its model_index.json); encoding and decoding are unavailable (WanTI2V.without_frozen_models)."""
        model = cls.__new__(cls)
        model.device = device
        model.compute_dtype = DTYPES[cfg.parallel.param_dtype]
        model.trajectory_dtype = trajectory_dtype(cfg.grpo.trajectory_dtype, cfg.parallel.param_dtype)
        model.boundary_ratio, model.boundary = boundary_ratio, int(boundary_ratio * NUM_TRAIN_TIMESTEPS)
        model.loaded = tuple(name for name in EXPERTS if name in experts)
        model.experts = dict(experts)
        model.transformer, model.transformer_2 = experts.get("high"), experts.get("low")
        return model

    @property
    def trainable(self) -> dict[str, torch.nn.Module]:
        """The loaded expert(s) by name (`high`, `low`), as training wraps and checkpoints them."""
        return dict(self.experts)

    def expert_for(self, t: float) -> str:
        """The name of the expert serving timestep t (sigma x 1000, see `timestep_of`)."""
        return route(t, self.boundary, self.loaded)

    def geometry(self, num_frames: int, height: int, width: int) -> LatentGeometry:
        if (num_frames - 1) % self.temporal:
            raise ConfigError(
                f"video.num_frames = {num_frames}: the I2V VAE needs num_frames = {self.temporal} k + 1 (e.g. 161)"
            )
        patch = tuple(next(iter(self.experts.values())).config.patch_size)
        multiple = self.spatial * patch[1]
        if height % multiple or width % multiple:
            raise ConfigError(
                f"video.height x video.width = {height} x {width}: both must be multiples of {multiple} "
                f"(VAE factor {self.spatial} x patch {patch[1]})"
            )
        return LatentGeometry(
            self.vae.config.z_dim,
            (num_frames - 1) // self.temporal + 1,
            height // self.spatial,
            width // self.spatial,
            patch,
        )

    @torch.no_grad()
    def encode_first_frames(self, images: np.ndarray, num_frames: int) -> torch.Tensor:
        """The I2V condition [B, 4 + C, F, h, w] float32 (mask; normalised VAE mode of each first frame followed by
        zero frames, `condition_dtype` values) of uint8 first frames [B, H, W, 3]."""
        batch, height, width, _ = images.shape
        geometry = self.geometry(num_frames, height, width)
        pixels = first_frame_pixels(images, self.device, self.condition_dtype).unsqueeze(2)
        video = torch.cat([pixels, pixels.new_zeros(batch, 3, num_frames - 1, height, width)], dim=2)
        # One video per VAE call: batched convolutions round differently, and a sample's condition must not
        # depend on which samples share its batch (nor on the VAE's memory at 161 frames).
        latents = torch.cat([self.vae.encode(v.to(self.frozen_dtype)).latent_dist.mode() for v in video.split(1)])
        # Times the reciprocal std, not divided by it: diffusers' and the reference's rounding.
        latents = normalise_condition(latents, self.latents_mean, self.latents_std, self.condition_dtype, divide=False)
        mask = first_frame_mask(num_frames, geometry.height, geometry.width, self.temporal).to(self.device)
        return torch.cat([mask.expand(batch, -1, -1, -1, -1), latents], dim=1)

    def encode_conditions(
        self,
        prompts: list[str],
        first_frames: list[Path],
        height: int,
        width: int,
        num_frames: int,
        cached: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt embeddings, I2V conditions) of a batch: what every rollout is conditioned on (`cached`:
        encode_prompts')."""
        images = load_first_frames(first_frames, height, width)
        return self.encode_prompts(prompts, cached), self.encode_first_frames(images, num_frames)

    def velocity(
        self,
        experts: Mapping[str, torch.nn.Module],
        x: torch.Tensor,
        sigma: float,
        embeds: torch.Tensor,
        guidance_scale: float = 1.0,
        *,
        condition: torch.Tensor,
    ) -> torch.Tensor:
        """Flow velocity (float32) of the whole latent x [B, C, F, h, w] at noise level sigma, from the expert
        `expert_for` names, looked up in `experts` (the caller's: wrapped for training, frozen for reference).

        `condition` is `encode_first_frames`' [B, 4 + C, F, h, w]. Classifier-free guidance only when the scale
        is > 1, with zero text embeddings as the unconditional branch (the reference's rule).
        """
        t = timestep_of(sigma)
        name = self.expert_for(t)
        if name not in experts:
            raise KeyError(f"step at t = {t} goes to the {name}-noise expert, absent from {sorted(experts)}")
        transformer = experts[name]
        timestep = torch.full((x.shape[0],), t, dtype=self.trajectory_dtype, device=x.device)
        hidden = torch.cat([x.to(self.compute_dtype), condition.to(self.compute_dtype)], dim=1)
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


def check_expert(path: Path, config, z_dim: int) -> None:
    """Refuse a transformer that is not an A14B I2V expert: 2 z + 4 channels in, z out, no image embedding."""
    want = 2 * z_dim + MASK_CHANNELS
    if config.in_channels != want or config.out_channels != z_dim:
        raise ConfigError(
            f"{path}: in/out_channels = {config.in_channels}/{config.out_channels}, but the I2V input with a "
            f"{z_dim}-channel VAE needs {want}/{z_dim}; model.kind i2v_a14b needs a Wan2.2 I2V-A14B pipeline"
        )
    if config.image_dim is not None:
        raise ConfigError(
            f"{path}: image_dim = {config.image_dim} (a Wan2.1 I2V transformer wanting CLIP image embeddings); "
            "model.kind i2v_a14b loads no image encoder: use a Wan2.2 I2V-A14B pipeline"
        )
