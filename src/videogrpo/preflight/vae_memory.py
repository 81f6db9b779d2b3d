"""The VAE decoder's peak while it decodes one video: what the memory plan's "decoded videos" term holds at once.

The Wan VAE decodes a video one latent frame at a time (a causal cache of each convolution's last frames carries
the context), so its working set is a few full-resolution feature maps of one latent frame's outputs, plus the video
decoded so far. This module counts that peak with the VAE's own code: the decoder is built from its config under
torch's FakeTensorMode (no memory, no arithmetic) and every tensor it allocates is tallied by a dispatch mode that
frees a tensor's bytes when its storage dies. Counting every frame of a long video this way takes seconds, so the
count runs at the video's height and width for three and four latent frames and extends the line through them to the
video's length (the peak grows by the decoded output's bytes per frame; tests/test_vae_memory.py checks the line
against the full count). Results are cached per (config, size, dtype, tile): `videogrpo plan` asks once per search.

With a tile size (grpo.vae_tile_size, models.wan.tile_decoding) the VAE decodes overlapping square tiles and blends
them: one tile's working set at a time, while every decoded tile is held until the blend.

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
            vae = AutoencoderKLWan(**config).eval()
            tile_decoding(vae, tile)
            latents = torch.zeros(1, config["z_dim"], latent_frames, height // spatial, width // spatial)
            tally = _LiveBytes()
            with torch.no_grad(), tally:
                vae.decode(latents)
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

            out = func(*args, **(kwargs or {}))
            for tensor in tree_flatten(out)[0]:
                if not isinstance(tensor, torch.Tensor):
                    continue
                storage = tensor.untyped_storage()
                key = storage._cdata  # views and in-place results share their base's storage: counted once
                if key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.now += self.live[key]
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, key)
            return out

    return LiveBytes


def _LiveBytes():  # noqa: N802 (a class built on first use: torch is imported lazily)
    return _live_bytes_mode()()
