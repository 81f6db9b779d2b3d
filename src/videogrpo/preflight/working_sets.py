"""What a forward without gradients holds at once, counted with the models' own code on fake tensors: the VAE
decoder's peak while it decodes one video (the memory plan's "decoded videos" term) and the transformer's while it
denoises one row of a rollout (its "rollout working set").

Each model is built from its config under torch's FakeTensorMode (no memory, no arithmetic) and every tensor an op
allocates is tallied by a dispatch mode that frees a tensor's bytes when its storage dies; views and in-place results
share a storage and count nothing. What existed before the count (weights, inputs) is not counted.

The Wan VAE decodes a video one latent frame at a time (a causal cache of each convolution's last frames carries
the context), so its working set is a few full-resolution feature maps of one latent frame's outputs, plus the video
decoded so far. Counting every frame of a long video this way takes seconds, so the
count runs at the video's height and width for three and four latent frames and extends the line through them to the
video's length (the peak grows by the decoded output's bytes per frame; tests/test_working_sets.py checks the line
against the full count). Results are cached per (config, size, dtype, tile): `videogrpo plan` asks once per search.

With a tile size (grpo.vae_tile_size, models.wan.tile_decoding) the VAE decodes overlapping square tiles and blends
them: one tile's working set at a time, while every decoded tile is held until the blend.

A rollout's forward holds one block's transient tensors (q, k, v, the attention output, the FFN's hidden layer) on
top of the hidden states, the text and time embeddings and RoPE's tables; it grows with the rows and tokens, so it is
counted for one row at the run's latent shape and taken once per row (the rows of a forward are independent).

May import: `models` and the core modules (torch and diffusers lazily: building the CLI's parser imports none).
"""

from __future__ import annotations

import json
import weakref
from functools import lru_cache

FEW_LATENT_FRAMES = (3, 4)
"""The latent frame counts the peak is counted at; the line through them gives any longer video. (The first latent
frame decodes to one frame, the others to `scale_factor_temporal` each, and the causal caches fill by the third:
from there on the peak grows by one latent frame's output per latent frame.)"""


def decoder_peak_bytes(
    vae_config: dict, frames: int, height: int, width: int, dtype: str, tile: int | None = None
) -> int:
    """Peak bytes allocated while the VAE of `vae_config` decodes one `frames` x `height` x `width` video in `dtype`,
    in `tile`-pixel tiles or whole frames (None); its output included, the latents it starts from and its weights
    not."""
    key = json.dumps({k: v for k, v in vae_config.items() if not k.startswith("_")}, sort_keys=True, default=list)
    temporal = vae_config.get("scale_factor_temporal") or 4
    latent_frames = (frames - 1) // temporal + 1
    if latent_frames <= FEW_LATENT_FRAMES[-1]:
        return _counted_peak(key, latent_frames, height, width, dtype, tile)
    (f1, p1), (f2, p2) = ((f, _counted_peak(key, f, height, width, dtype, tile)) for f in FEW_LATENT_FRAMES)
    per_latent_frame = (p2 - p1) / (f2 - f1)
    return int(round(p1 + per_latent_frame * (latent_frames - f1)))


@lru_cache(maxsize=64)
def _counted_peak(config_json: str, latent_frames: int, height: int, width: int, dtype: str, tile: int | None) -> int:
    import torch
    from diffusers import AutoencoderKLWan
    from torch._subclasses.fake_tensor import FakeTensorMode

    from videogrpo.models.wan import tile_decoding

    config = json.loads(config_json)
    spatial = config.get("scale_factor_spatial") or 8
    if height % spatial or width % spatial:
        raise ValueError(f"video {height}x{width}: not a multiple of the VAE's spatial compression {spatial}")
    previous = torch.get_default_dtype()
    try:
        with FakeTensorMode():
            torch.set_default_dtype(getattr(torch, dtype))  # built in the dtype: a fake module cannot be cast
            vae = AutoencoderKLWan.from_config(config).eval()  # from_config: keys of newer releases pass
            tile_decoding(vae, tile)
            latents = torch.zeros(1, config["z_dim"], latent_frames, height // spatial, width // spatial)
            tally = _LiveBytes()
            with torch.no_grad(), tally:
                vae.decode(latents)
    finally:
        torch.set_default_dtype(previous)
    return tally.peak


def forward_peak_bytes(
    transformer_config: dict, latent: tuple[int, ...], text_tokens: int, dtype: str, per_token_timestep: bool
) -> int:
    """Peak bytes allocated while the WanTransformer3DModel of `transformer_config` (its weights in `dtype`) takes
    one row of a latent shaped `latent` ([channels, frames, h, w]; the model's own input channels are fed) and
    `text_tokens` text tokens without gradients, with a timestep per token (TI2V) or per row (I2V)."""
    key = json.dumps({k: v for k, v in transformer_config.items() if not k.startswith("_")}, sort_keys=True)
    return _counted_forward(key, tuple(latent), text_tokens, dtype, per_token_timestep)


@lru_cache(maxsize=64)
def _counted_forward(
    config_json: str, latent: tuple[int, ...], text_tokens: int, dtype: str, per_token_timestep: bool, rows: int = 1
) -> int:
    import math

    import torch
    from diffusers import WanTransformer3DModel
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = json.loads(config_json)
    _, frames, height, width = latent
    patch = config.get("patch_size") or (1, 2, 2)
    tokens = frames * height * width // math.prod(patch)
    previous = torch.get_default_dtype()
    try:
        with FakeTensorMode():
            torch.set_default_dtype(getattr(torch, dtype))
            model = WanTransformer3DModel.from_config(config).eval()
            x = torch.zeros(rows, config["in_channels"], frames, height, width)
            timestep = torch.zeros(rows, tokens) if per_token_timestep else torch.zeros(rows)
            text = torch.zeros(rows, text_tokens, config["text_dim"])
            tally = _LiveBytes()
            with torch.no_grad(), tally:
                model(x, timestep, text, return_dict=False)
    finally:
        torch.set_default_dtype(previous)
    return tally.peak


def _live_bytes_mode():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        """Tallies the bytes of every storage an op allocates until the storage is freed, and the peak."""

        def __init__(self):
            super().__init__()
            self.live: dict[int, int] = {}
            self.now = 0
            self.peak = 0

        def _freed(self, key: int) -> None:
            self.now -= self.live.pop(key)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            import torch

            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            # A view or an in-place result shares an input's storage: nothing new, even when the input was allocated
            # before the tally began (a weight, the latents).
            given = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for tensor in tree_flatten(out)[0]:
                if not isinstance(tensor, torch.Tensor):
                    continue
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key not in self.live and key not in given:
                    self.live[key] = storage.nbytes()
                    self.now += self.live[key]
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, key)
            return out

    return LiveBytes


def _LiveBytes():  # noqa: N802 (a class built on first use: torch is imported lazily)
    return _live_bytes_mode()()
