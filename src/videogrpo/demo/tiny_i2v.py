"""A tiny random two-expert Wan2.2 I2V-A14B-style Diffusers pipeline, built from configs with a fixed seed.

Same component classes and layout as Wan-AI/Wan2.2-I2V-A14B-Diffusers: two WanTransformer3DModel experts
(`transformer` for high noise, `transformer_2` for low noise) taking 36 channels (noisy latent 16, mask 4,
first-frame condition 16) and returning 16, patch (1, 2, 2), no image embedding; AutoencoderKLWan in the
Wan2.1 layout (z_dim 16, spatial factor 8, temporal 4, its real latents mean/std); the UMT5 encoder and
T5 tokenizer of the TI2V tiny model; a flow-matching scheduler; `boundary_ratio` in model_index.json and
no image encoder. Saved with `WanImageToVideoPipeline.save_pretrained`, so later stages load it exactly as
they would load the real model. The experts' shape is models/shapes.py's TINY_I2V_EXPERT.

The boundary: with the tiny 8 sampling steps and shift 5 the steps' t = sigma x 1000 are 1000, 972.2,
937.5, 892.9, 833.3, 750, 625, 416.7. A ratio of 0.875 gives the high-noise expert steps 0-3 and the
low-noise expert steps 4-7, each side at least 17 timesteps away from the boundary (the released 0.9
would leave the high-noise expert 3 steps, the nearest 7 away).
"""

from __future__ import annotations

from pathlib import Path

import torch

from videogrpo.demo.tiny_ti2v import FLOW_SHIFT, TEXT_ENCODER, tokenizer_vocab
from videogrpo.models.shapes import TINY_I2V_EXPERT

LATENT_CHANNELS = 16
# latents_mean/std are left at AutoencoderKLWan's defaults, the real Wan2.1 VAE's statistics, so that a
# missing or doubled normalisation shows in the tests.
VAE = dict(
    base_dim=4,
    z_dim=LATENT_CHANNELS,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    scale_factor_spatial=8,
    scale_factor_temporal=4,
)
BOUNDARY_RATIO = 0.875


def build_tiny_i2v_pipeline(seed: int):
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanTransformer3DModel,
    )
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    tokenizer = T5Tokenizer(vocab=tokenizer_vocab(), extra_ids=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # Drawn one after the other from one stream, so the two experts differ (routing is observable).
        transformer = WanTransformer3DModel(**TINY_I2V_EXPERT)
        transformer_2 = WanTransformer3DModel(**TINY_I2V_EXPERT)
        vae = AutoencoderKLWan(**VAE)
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **TEXT_ENCODER))
    return WanImageToVideoPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT),
        image_processor=None,
        image_encoder=None,
        transformer=transformer,
        transformer_2=transformer_2,
        boundary_ratio=BOUNDARY_RATIO,
    )


def save_tiny_i2v_pipeline(out_dir: str | Path, seed: int) -> None:
    build_tiny_i2v_pipeline(seed).save_pretrained(str(out_dir))
