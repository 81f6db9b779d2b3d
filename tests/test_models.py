import numpy as np
import pytest
import torch

from videogrpo.grpo.rollout import replay_log_prob, rollout, seeded_normal
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.models.tiny import build_tiny_pipeline
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
    i2v = WanImageToVideoPipeline.from_pretrained(str(tiny_model), image_encoder=None, image_processor=None,
                                                  expand_timesteps=True)
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


@pytest.mark.parametrize("sampler,eta", [("flowcps", 0.7), ("dancegrpo", 0.3), ("flowgrpo", 0.0)])
def test_on_policy_ratio_is_exactly_one_before_the_first_update(wan, dataset, sampler, eta):
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")[:2]
    embeds = wan.encode_prompts([s.prompt for s in samples])
    cond = wan.encode_first_frames(load_first_frames([s.first_frame for s in samples], 64, 64))
    shape = wan.geometry(17, 64, 64).shape
    init = torch.stack([seeded_normal(shape, wan.device, 0, i) for i in range(2)])
    sigmas = sigma_schedule(4, 5.0)
    etas = torch.full((2,), eta)
    traj = rollout(wan, wan.transformer, embeds, cond, init, sigmas, sampler, etas,
                   lambda i: torch.stack([seeded_normal(shape, wan.device, 1, i, j) for j in range(2)]))
    assert traj.latents.shape == (2, 5, *shape)
    assert torch.equal(traj.latents[:, :, :, :1], cond.unsqueeze(1).expand(-1, 5, -1, -1, -1, -1))
    for index in range(3):
        logp, _ = replay_log_prob(wan, wan.transformer, traj, index, sigmas, sampler, embeds)
        assert logp.requires_grad
        ratio = torch.exp(logp - traj.log_probs[:, index])
        assert torch.equal(ratio, torch.ones_like(ratio)), (sampler, index, ratio)
