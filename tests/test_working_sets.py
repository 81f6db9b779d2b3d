"""The working sets the memory plan counts with the models' own code (preflight/working_sets.py): the VAE decoder's
peak and a rollout forward's, and tiled decoding (grpo.vae_tile_size).

Each is counted by running diffusers' own model on fake tensors with a tally of live storages; these tests hold the
tally to real allocations, the line it extends to a long video to the full count, a forward's rows to one row's
count, and the tiles to the VAE.
"""

from __future__ import annotations

import json

import pytest
import torch

from videogrpo.demo.tiny_ti2v import VAE as TINY_VAE
from videogrpo.models.shapes import WAN_5B_VAE
from videogrpo.models.wan import tile_decoding
from videogrpo.preflight import memory_plan, model_shape, working_sets

from harness import solo_config, trainer_in_process

GIB = 1 << 30


def vae_args(config) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dict(config).items()}


def test_the_tally_follows_what_torch_allocates_and_frees():
    weight = torch.ones(64, 64)  # allocated before the count: its views are not allocations
    tally = working_sets._LiveBytes()
    with tally:
        weight.t()
        weight[:2].view(-1)
        x = torch.ones(1000)  # 4,000 B
        y = x * 2  # 8,000 B live
        view = y[:10]  # a view: no new storage
        y.add_(1)  # in place: no new storage
        del x
        z = torch.ones(500)  # 6,000 B live again: the peak stays 8,000
    assert (tally.peak, tally.now) == (8000, 6000)
    del y, view, z
    assert tally.now == 0


def test_the_fake_count_equals_the_tally_of_a_real_decode():
    """Fake tensors allocate what real ones would: the tiny VAE decoded for real and on fake tensors peaks alike."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**TINY_VAE).eval()
    latents = torch.randn(1, TINY_VAE["z_dim"], 3, 4, 4)
    tally = working_sets._LiveBytes()
    with torch.no_grad(), tally:
        vae.decode(latents)
    key = json.dumps(TINY_VAE, sort_keys=True)
    assert working_sets._counted_peak(key, 3, 64, 64, "float32", None) == tally.peak


@pytest.mark.parametrize("tile", [None, 256], ids=["whole frames", "256-pixel tiles"])
def test_the_peak_of_a_long_video_is_the_line_through_two_short_counts(tile):
    """The count at three and four latent frames, extended, is the full count of 33 frames (9 latent frames) of the
    5B's VAE at 320x320 (2 x 2 tiles of 256 pixels with the tiles)."""
    config = vae_args(WAN_5B_VAE)
    full = working_sets._counted_peak(json.dumps(config, sort_keys=True), 9, 320, 320, "bfloat16", tile)
    line = working_sets.decoder_peak_bytes(config, 33, 320, 320, "bfloat16", tile)
    assert abs(line - full) <= 0.005 * full, (line, full)


def test_the_decoders_peak_is_in_the_plan_per_video_of_a_decode_batch_and_tiles_bound_it():
    """At 512x512x81 the 5B's decoder peaks at 2.75 GiB a video, more than what follows it; a decode batch holds one
    per video; 256-pixel tiles bring it under 1 GiB."""
    config = vae_args(WAN_5B_VAE)
    whole = working_sets.decoder_peak_bytes(config, 81, 512, 512, "bfloat16")
    tiled = working_sets.decoder_peak_bytes(config, 81, 512, 512, "bfloat16", 256)
    assert 2.7 * GIB < whole < 2.8 * GIB and tiled < GIB
    counts = model_shape.ParamCounts.from_shapes({"blocks.0.w": (4, 4)})
    shape = model_shape.ModelShape({}, counts, 0, 48, 16, 4, vae=config)
    for tile, per_video in ((None, whole), (256, tiled)):
        term = decoded_videos(shape, decode_rows=3, vae_tile_size=tile)
        assert term.bytes == 3 * per_video and f"{per_video / GIB:.2f} GiB" in term.detail


def decoded_videos(shape, **given) -> memory_plan.Term:
    from videogrpo.models.shapes import WAN_TI2V_5B

    shape = model_shape.ModelShape(dict(WAN_TI2V_5B), shape.params, 0, 48, 16, 4, vae=shape.vae)
    plan = memory_plan.plan(
        shape,
        frames=81,
        height=512,
        width=512,
        text_tokens=512,
        sampling_steps=2,
        world=1,
        data_parallel="replicate",
        shard_group_size=1,
        tensor_parallel=1,
        rows_per_forward=1,
        rows_per_batch=1,
        compute_dtype="bfloat16",
        reduce_dtype="float32",
        trajectory_dtype="bfloat16",
        frozen_dtype="bfloat16",
        **given,
    )
    return next(t for t in plan.terms if t.name == "decoded videos")


def test_tiled_decoding_decodes_in_blended_tiles_and_whole_frames_again_when_off():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**TINY_VAE).eval()
    latents = torch.randn(1, TINY_VAE["z_dim"], 2, 8, 8)  # 128 x 128 pixels: 64-pixel tiles at a 48-pixel stride
    with torch.no_grad():
        whole = vae.decode(latents).sample
        tile_decoding(vae, 64)
        assert (vae.use_tiling, vae.tile_sample_min_width, vae.tile_sample_stride_height) == (True, 64, 48)
        tiled = vae.decode(latents).sample
        tile_decoding(vae, None)
        again = vae.decode(latents).sample
    assert tiled.shape == whole.shape and not torch.equal(tiled, whole)  # the seams are blended: other pixels
    assert torch.equal(again, whole)


def test_the_fake_count_of_a_forward_equals_the_tally_of_a_real_one_and_rows_add_up():
    """The tiny transformer's forward without gradients, for real and on fake tensors, peaks alike; the 5B's at
    256x256x81 holds twice one row's for two rows (to 1 %), which is how the plan takes it."""
    from diffusers import WanTransformer3DModel

    from videogrpo.models.shapes import TINY_TI2V, WAN_TI2V_5B

    config = vae_args(TINY_TI2V)
    torch.manual_seed(0)
    model = WanTransformer3DModel(**config).eval()
    x, text = torch.randn(1, 48, 3, 4, 4), torch.randn(1, 8, config["text_dim"])
    tally = working_sets._LiveBytes()
    with torch.no_grad(), tally:
        model(x, torch.zeros(1, 12), text, return_dict=False)
    counted = working_sets.forward_peak_bytes(config, (48, 3, 4, 4), 8, "float32", True)
    assert abs(counted - tally.peak) <= 0.005 * tally.peak, (counted, tally.peak)  # seen: 48 B of 53 kB apart

    five_b = vae_args(WAN_TI2V_5B)
    one = working_sets.forward_peak_bytes(five_b, (48, 21, 16, 16), 512, "bfloat16", True)
    key = json.dumps({k: v for k, v in five_b.items() if not k.startswith("_")}, sort_keys=True)
    two = working_sets._counted_forward(key, (48, 21, 16, 16), 512, "bfloat16", True, rows=2)
    assert abs(two - 2 * one) <= 0.01 * two, (one, two)


def test_the_trainer_decodes_its_rollouts_in_the_configured_tiles(tiny_model, dataset, tmp_path):

    cfg = solo_config(train={"max_steps": 1})
    cfg["grpo"]["vae_tile_size"] = 64
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    trainer.scorer.close()
    assert trainer.model.vae.use_tiling and trainer.model.vae.tile_sample_min_height == 64
