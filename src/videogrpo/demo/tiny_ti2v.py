"""A tiny random Wan2.2 TI2V-style Diffusers pipeline, built from configs with a fixed seed.

Same component classes and layout as Wan-AI/Wan2.2-TI2V-5B-Diffusers (WanTransformer3DModel with
patch (1, 2, 2), AutoencoderKLWan with 48 latent channels, patch 2, spatial factor 16, UMT5 encoder,
a T5 tokenizer, a flow-matching scheduler), small enough to train on a laptop CPU and saved with
`save_pretrained`, so that every later stage loads it exactly as it would load the real model. The
transformer's shape is models/shapes.py's TINY_TI2V.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from videogrpo.models.shapes import TINY_TI2V

VAE = dict(
    base_dim=4,
    z_dim=48,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    in_channels=12,
    out_channels=12,
    patch_size=2,
    is_residual=True,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
    latents_mean=[0.0] * 48,
    latents_std=[1.0] * 48,
)
TEXT_ENCODER = dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, relative_attention_num_buckets=8)
FLOW_SHIFT = 5.0


def tokenizer_vocab() -> list[tuple[str, float]]:
    """A character-level SentencePiece vocabulary: enough to tokenize any English prompt offline."""
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    chars = string.ascii_lowercase + string.ascii_uppercase + string.digits + ".,;:!?'\"-()/"
    return specials + [("▁", -1.0)] + [(c, -2.0) for c in chars] + [("▁" + c, -1.5) for c in string.ascii_lowercase]


def build_tiny_pipeline(seed: int):
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    tokenizer = T5Tokenizer(vocab=tokenizer_vocab(), extra_ids=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = WanTransformer3DModel(**TINY_TI2V)
        vae = AutoencoderKLWan(**VAE)
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **TEXT_ENCODER))
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT),
        expand_timesteps=True,
    )


def save_tiny_pipeline(out_dir: str | Path, seed: int) -> None:
    build_tiny_pipeline(seed).save_pretrained(str(out_dir))
