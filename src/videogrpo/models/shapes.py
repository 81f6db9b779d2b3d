"""The Wan transformer shapes this project builds, counts and plans, one table: each entry is the keyword arguments of
diffusers' `WanTransformer3DModel` (what a transformer/config.json holds, less its `_`-prefixed fields).

The tiny default's builders (demo/tiny_ti2v.py, demo/tiny_i2v.py), the FLOPs and memory-plan tests, the GPU tier
and the GPU smoke benchmark all read these entries, so a shape is written once. Entries are read-only mappings:
a caller that wants another shape writes `{**ENTRY, "num_layers": 8}`, and one that mutates an entry in place
(which would change every later reader's model, the tiny default's weights included) gets a TypeError.

Torch-free: the table is read where torch is not imported (the workflow, the memory plan's arithmetic).
"""

from __future__ import annotations

from types import MappingProxyType

# The real models. The Hub's Wan-AI/Wan2.2-TI2V-5B-Diffusers and Wan-AI/Wan2.2-I2V-A14B-Diffusers were converted
# by diffusers' scripts/convert_wan_to_diffusers.py (model types "Wan2.2-TI2V-5B" and "Wan2.2-I2V-14B-720p",
# added in diffusers PR 12004): its `diffusers_config` for each gives every value below but the last three;
# width, depth, FFN size, norms and eps agree with the original release's wan/configs/wan_ti2v_5B.py and
# wan_i2v_A14B.py (Wan-Video/Wan2.2: dim 3072 = 24 heads x 128, and 5120 = 40 x 128). The conversion leaves
# image_dim, rope_max_seq_len and pos_embed_seq_len at WanTransformer3DModel's defaults (None, 1024, None), which
# save_pretrained writes into the Hub's config.json as such. Built on the meta device (diffusers 0.42) they
# count 4,999,787,712 parameters ("5B") and 14,288,901,184 per expert ("A14B": two of them, one running at a
# time); tests/test_shapes.py checks both.
WAN_TI2V_5B = MappingProxyType(
    dict(
        patch_size=(1, 2, 2),
        num_attention_heads=24,
        attention_head_dim=128,
        in_channels=48,  # the Wan2.2 VAE's 48 latent channels; the first frame conditions by replacing its latent
        out_channels=48,
        text_dim=4096,  # UMT5-XXL's width
        freq_dim=256,
        ffn_dim=14336,
        num_layers=30,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        added_kv_proj_dim=None,
        image_dim=None,
        rope_max_seq_len=1024,
        pos_embed_seq_len=None,
    )
)
"""Wan2.2-TI2V-5B's transformer (transformer/config.json of Wan-AI/Wan2.2-TI2V-5B-Diffusers)."""

WAN_I2V_A14B_EXPERT = MappingProxyType(
    {
        **WAN_TI2V_5B,  # the same block design and embeddings, wider and deeper
        "num_attention_heads": 40,
        "in_channels": 36,  # the Wan2.1 VAE's 16 noisy latent channels, 4 of mask, 16 of the first frame's latent
        "out_channels": 16,
        "ffn_dim": 13824,
        "num_layers": 40,
    }
)
"""Each of Wan2.2-I2V-A14B's two experts (transformer/ and transformer_2/config.json of
Wan-AI/Wan2.2-I2V-A14B-Diffusers: the high-noise and the low-noise expert share one architecture)."""

# The real models' frozen components, the fields of their config.json that size them: the UMT5-XXL text encoder both
# pipelines share (text_encoder/config.json), the Wan2.2 VAE of the TI2V-5B (vae/config.json) and the Wan2.1 VAE of
# the I2V-A14B (AutoencoderKLWan's defaults are its config). `videogrpo plan` counts their parameters on the meta
# device where no model has been downloaded; preflight reads the downloaded model's safetensors headers instead.
UMT5_XXL = MappingProxyType(dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64))
WAN_5B_VAE = MappingProxyType(
    dict(
        base_dim=160,
        decoder_base_dim=256,
        z_dim=48,
        dim_mult=(1, 2, 4, 4),
        num_res_blocks=2,
        temperal_downsample=(False, True, True),
        in_channels=12,
        out_channels=12,
        patch_size=2,
        is_residual=True,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
    )
)
WAN_21_VAE = MappingProxyType(
    dict(base_dim=96, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=2, temperal_downsample=(False, True, True))
)
FROZEN_MODELS = MappingProxyType({"ti2v": (UMT5_XXL, WAN_5B_VAE), "i2v_a14b": (UMT5_XXL, WAN_21_VAE)})
"""Each released model kind's (text encoder, VAE) configs."""

# The tiny default's transformers. The demo builds its pipelines from these with a fixed seed: a change of any
# value changes the tiny model's weights, hence every digest of a tiny run downstream of fetch_model.
TINY_TI2V = MappingProxyType(
    dict(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=24,
        in_channels=48,
        out_channels=48,
        text_dim=32,
        freq_dim=32,
        ffn_dim=96,
        num_layers=2,
        rope_max_seq_len=64,
    )
)
"""The transformer of the tiny TI2V pipeline (demo/tiny_ti2v.py): the 5B's channels and patch, 2 blocks of 48."""

TINY_I2V_EXPERT = MappingProxyType({**TINY_TI2V, "in_channels": 36, "out_channels": 16, "image_dim": None})
"""Each expert of the tiny two-expert I2V pipeline (demo/tiny_i2v.py): the A14B expert's channels, tiny widths."""

TINY_TENSOR_PARALLEL_EXPERT = MappingProxyType(
    {
        **TINY_I2V_EXPERT,
        "num_attention_heads": 4,
        "attention_head_dim": 8,
        "text_dim": 16,
        "freq_dim": 16,
        "ffn_dim": 32,
        "rope_max_seq_len": 32,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",  # normalised over all heads: the TP plan all-reduces it
    }
)
"""A tiny I2V expert whose 4 heads and FFN of 32 split over tensor_parallel 2 and 4 (the tiny expert's 2 heads
split over 2 only): the tensor-parallel tests (tests/tp_worker.py, tests/test_tensor_parallel.py)."""

# Between tiny and real: shapes where a per-token count or a formula is checked beyond the tiny model's widths.
SMALL_TI2V = MappingProxyType(
    {
        **TINY_TI2V,
        "num_attention_heads": 6,
        "attention_head_dim": 64,
        "text_dim": 128,
        "freq_dim": 256,
        "ffn_dim": 1536,
        "num_layers": 3,
    }
)
"""A TI2V transformer of 3 blocks of width 384 (6 heads x 64, FFN 4 x 384): big enough that the FLOPs and
activation formulas are checked at a head size of the real models' order, small enough for a CPU forward."""

SMALL_I2V_EXPERT = MappingProxyType({**SMALL_TI2V, "in_channels": 36, "out_channels": 16})
"""SMALL_TI2V with the I2V expert's input: 36 channels in, 16 out."""

MID_TI2V = MappingProxyType(
    {**WAN_TI2V_5B, "num_attention_heads": 12, "ffn_dim": 4096, "num_layers": 8, "text_dim": 1024}
)
"""The 5B's transformer at half its width (12 heads x 128), 8 blocks and a text width of 1024: the GPU tier's
memory plan against the measured peak and the GPU smoke benchmark's mid-size run, in seconds on one GPU."""

TINY_TI2V_5B_LAYOUT = MappingProxyType(
    {
        **WAN_TI2V_5B,
        "num_attention_heads": 2,
        "attention_head_dim": 24,
        "ffn_dim": 96,
        "num_layers": 2,
        "text_dim": 32,
    }
)
"""The 5B's transformer at the tiny default's widths and depth, keeping its frequency embedding (256) and RoPE
table (1024): what the GPU smoke benchmark runs with --cpu, and the GPU tier compiles."""


LATENT_GEOMETRY = MappingProxyType(
    {
        "ti2v": MappingProxyType(dict(z_dim=48, spatial=16, temporal=4)),
        "i2v_a14b": MappingProxyType(dict(z_dim=16, spatial=8, temporal=4)),
    }
)
"""Each model kind's VAE latent geometry (vae/config.json: z_dim, scale_factor_spatial, scale_factor_temporal): the
Wan2.2 VAE of TI2V-5B and the Wan2.1 VAE of I2V-A14B; the tiny models keep their kind's (demo/tiny_ti2v.py,
demo/tiny_i2v.py)."""
