import numpy as np
import pytest
import torch

from videogrpo.demo.tiny_ti2v import build_tiny_pipeline
from videogrpo.grpo.draws import seeded_normal
from videogrpo.grpo.rollout import replay_log_prob, rollout
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.models.wan import WanTI2V, load_first_frames
from videogrpo.provenance.digest import tree_digest


@pytest.fixture(scope="module")
def wan(tiny_model):
    return WanTI2V(tiny_model, torch.device("cpu"), max_text_tokens=32)


def test_tiny_pipeline_is_deterministic_and_small(tiny_model, tmp_path):
    build_tiny_pipeline(0).save_pretrained(str(tmp_path / "again"))
    assert tree_digest(tmp_path / "again") == tree_digest(tiny_model)
    size = sum(p.stat().st_size for p in tiny_model.rglob("*") if p.is_file())
    assert size < 2_000_000


def test_tiny_pipeline_loads_in_the_diffusers_ti2v_pipelines(tiny_model):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    assert WanPipeline.from_pretrained(str(tiny_model)).config.expand_timesteps
    i2v = WanImageToVideoPipeline.from_pretrained(
        str(tiny_model), image_encoder=None, image_processor=None, expand_timesteps=True
    )
    assert i2v.transformer.config.in_channels == 48 and i2v.vae.config.z_dim == 48


def test_encode_decode_shapes(wan, dataset):
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")[:2]
    frames = load_first_frames([s.first_frame for s in samples], 64, 64)
    cond = wan.encode_first_frames(frames)
    geometry = wan.geometry(17, 64, 64)
    assert cond.shape == (2, 48, 1, 4, 4) and geometry.shape == (48, 5, 4, 4)
    embeds = wan.encode_prompts([s.prompt for s in samples])
    assert embeds.shape == (2, 32, 32)
    video = wan.decode(torch.zeros(1, *geometry.shape))
    assert video.shape == (1, 17, 64, 64, 3) and video.dtype == np.uint8


def rollout_of(wan, dataset, sampler, eta, steps=4):
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")[:2]
    embeds = wan.encode_prompts([s.prompt for s in samples])
    cond = wan.encode_first_frames(load_first_frames([s.first_frame for s in samples], 64, 64))
    shape = wan.geometry(17, 64, 64).shape
    init = torch.stack([seeded_normal(shape, wan.device, 0, i) for i in range(2)])
    sigmas = sigma_schedule(steps, 5.0)
    traj = rollout(
        wan,
        wan.transformer,
        embeds,
        cond,
        init,
        sigmas,
        sampler,
        torch.full((2,), eta),
        lambda i: torch.stack([seeded_normal(shape, wan.device, 1, i, j) for j in range(2)]),
    )
    return traj, embeds, cond, sigmas


@pytest.mark.parametrize(
    "sampler,eta", [("flowcps", 0.7), ("dancegrpo", 0.3), ("flowgrpo", 0.0), ("flowgrpo_sde", 0.7)]
)
def test_on_policy_ratio_is_exactly_one_before_the_first_update(wan, dataset, sampler, eta):
    traj, embeds, cond, sigmas = rollout_of(wan, dataset, sampler, eta)
    shape = wan.geometry(17, 64, 64).shape
    assert traj.latents.shape == (2, 5, *shape)
    assert torch.equal(traj.latents[:, :, :, :1], cond.unsqueeze(1).expand(-1, 5, -1, -1, -1, -1))
    for index in range(3):
        new = replay_log_prob(wan, wan.transformer, traj, index, sigmas, sampler, embeds)
        assert new.log_prob.requires_grad
        ratio = torch.exp(new.log_prob - traj.log_probs[:, index])
        assert torch.equal(ratio, torch.ones_like(ratio)), (sampler, index, ratio)


@pytest.fixture(scope="module")
def wan_bf16(tiny_model):
    return WanTI2V(tiny_model, torch.device("cpu"), "bfloat16", max_text_tokens=32)


def test_bf16_compute_keeps_float32_master_weights_and_a_bf16_trajectory(wan_bf16, dataset):
    assert {p.dtype for p in wan_bf16.transformer.parameters()} == {torch.float32}
    assert wan_bf16.trajectory_dtype == torch.bfloat16
    traj, embeds, _, sigmas = rollout_of(wan_bf16, dataset, "flowcps", 0.7)
    assert traj.latents.dtype == torch.bfloat16 and traj.log_probs.dtype == torch.float32
    for index in range(3):  # replaying the stored bf16 latents under autocast reproduces the rollout exactly
        new = replay_log_prob(wan_bf16, wan_bf16.transformer, traj, index, sigmas, "flowcps", embeds)
        assert torch.equal(new.log_prob, traj.log_probs[:, index])


def timesteps_seen(wan, x):
    seen = []
    hook = wan.transformer.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["timestep"]), with_kwargs=True
    )
    try:
        wan.velocity(wan.transformer, x, 0.9375, torch.zeros(1, 32, 32, dtype=wan.compute_dtype))
    finally:
        hook.remove()
    return seen[0]


def test_the_timestep_reaches_the_transformer_in_the_trajectory_dtype(tiny_model, wan_bf16):
    x = torch.zeros(1, *wan_bf16.geometry(17, 64, 64).shape)
    seen = timesteps_seen(wan_bf16, x)
    assert seen.dtype == torch.bfloat16 and seen.max().item() == 936.0  # 937.5 in bf16, as the reference
    assert seen[0, 0].item() == 0.0  # latent frame 0 is the clean condition
    kept = WanTI2V(tiny_model, torch.device("cpu"), "bfloat16", max_text_tokens=32, trajectory="float32")
    assert timesteps_seen(kept, x).max().item() == 937.5 and kept.trajectory_dtype == torch.float32


def test_guidance_only_above_one_with_zero_text_embeddings(wan, dataset):
    from videogrpo.data.dataset import load_split

    embeds = wan.encode_prompts([load_split(dataset, "rl")[0].prompt])
    x = seeded_normal(wan.geometry(17, 64, 64).shape, wan.device, 3).unsqueeze(0)
    cond = wan.velocity(wan.transformer, x, 0.6, embeds)
    uncond = wan.velocity(wan.transformer, x, 0.6, torch.zeros_like(embeds))
    assert not torch.equal(cond, uncond)
    torch.testing.assert_close(wan.velocity(wan.transformer, x, 0.6, embeds, 3.0), uncond + 3.0 * (cond - uncond))
    assert torch.equal(wan.velocity(wan.transformer, x, 0.6, embeds, 0.5), cond)  # <= 1: no guidance at all


def test_prompts_are_cleaned_before_encoding(wan):
    raw = wan.encode_prompts(["  a red\n\tsquare &amp;amp; a  circle "])
    assert torch.equal(raw, wan.encode_prompts(["a red square & a circle"]))


def test_first_frames_are_resized_with_lanczos(dataset, tmp_path):
    from PIL import Image

    from videogrpo.data.dataset import load_split

    path = load_split(dataset, "rl")[0].first_frame
    got = load_first_frames([path], 32, 32)[0]
    with Image.open(path) as image:
        assert np.array_equal(got, np.asarray(image.convert("RGB").resize((32, 32), Image.LANCZOS)))
        assert not np.array_equal(got, np.asarray(image.convert("RGB").resize((32, 32), Image.BICUBIC)))
