"""The two-expert Wan2.2 I2V-A14B model against diffusers' own WanImageToVideoPipeline, on the tiny model (CPU)."""

import json
import shutil

import numpy as np
import pytest
import torch

from videogrpo.demo.tiny_i2v import build_tiny_i2v_pipeline, save_tiny_i2v_pipeline
from videogrpo.errors import ConfigError
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.models.i2v import WanI2VA14B, boundary_of, expert_schedule, route, timestep_of
from videogrpo.provenance.digest import tree_digest

FRAMES, HEIGHT, WIDTH = 9, 32, 48  # 3 latent frames of 4 x 6: height != width catches a transposed layout
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_i2v(tmp_path_factory):
    out = tmp_path_factory.mktemp("i2v") / "pipeline"
    save_tiny_i2v_pipeline(out, seed=0)
    return out


@pytest.fixture(scope="module")
def model(tiny_i2v):
    return WanI2VA14B(tiny_i2v, CPU, max_text_tokens=32, condition_dtype="float32")  # diffusers' arithmetic


@pytest.fixture(scope="module")
def pipe(tiny_i2v):
    from diffusers import WanImageToVideoPipeline

    return WanImageToVideoPipeline.from_pretrained(str(tiny_i2v))


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, HEIGHT, WIDTH, 3), dtype=np.uint8)


def noise(model, seed: int) -> torch.Tensor:
    shape = model.geometry(FRAMES, HEIGHT, WIDTH).shape
    return torch.randn((1, *shape), generator=torch.Generator().manual_seed(seed))


def count_calls(experts: dict) -> tuple[list[str], list]:
    """Forward hooks recording which expert ran, in order (removed by the caller through the handles)."""
    seen: list[str] = []
    handles = [m.register_forward_hook(lambda *_, n=name: seen.append(n)) for name, m in experts.items()]
    return seen, handles


def test_tiny_i2v_pipeline_has_the_a14b_layout(tiny_i2v, pipe, tmp_path):
    build_tiny_i2v_pipeline(0).save_pretrained(str(tmp_path / "again"))
    assert tree_digest(tmp_path / "again") == tree_digest(tiny_i2v)
    assert sum(p.stat().st_size for p in tiny_i2v.rglob("*") if p.is_file()) < 2_000_000
    index = json.loads((tiny_i2v / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline"
    assert index["transformer_2"] == ["diffusers", "WanTransformer3DModel"]
    assert index["image_encoder"] == [None, None] and index["boundary_ratio"] == 0.875
    assert pipe.image_encoder is None and not pipe.config.expand_timesteps
    for expert in (pipe.transformer, pipe.transformer_2):
        c = expert.config
        assert (c.in_channels, c.out_channels, tuple(c.patch_size), c.image_dim) == (36, 16, (1, 2, 2), None)
    vae = pipe.vae.config
    assert (vae.z_dim, vae.scale_factor_spatial, vae.scale_factor_temporal) == (16, 8, 4)
    assert len(set(vae.latents_std)) > 1 and any(vae.latents_mean)  # a real normalisation, not the identity
    high, low = (dict(e.named_parameters())["proj_out.weight"] for e in (pipe.transformer, pipe.transformer_2))
    assert not torch.equal(high, low)


def test_condition_equals_diffusers_prepare_latents(model, pipe):
    """(a) The 20 conditioning channels, batched, equal diffusers' prepare_latents per image, to the bit."""
    from PIL import Image

    frames = images(2)
    ours = model.encode_first_frames(frames, FRAMES)
    assert ours.shape == (2, 20, 3, 4, 6) and ours.dtype == torch.float32
    for i, image in enumerate(frames):
        pixels = pipe.video_processor.preprocess(Image.fromarray(image), HEIGHT, WIDTH)
        generator = torch.Generator().manual_seed(i)
        _, theirs = pipe.prepare_latents(pixels, 1, 16, HEIGHT, WIDTH, FRAMES, torch.float32, CPU, generator)
        torch.testing.assert_close(ours[i : i + 1], theirs, rtol=0, atol=0)
    mask, latent = ours[:, :4], ours[:, 4:]
    assert torch.equal(mask[:, :, 0], torch.ones_like(mask[:, :, 0])) and not mask[:, :, 1:].any()
    # The zero pixel frames encode to non-zero latents (the causal VAE carries frame 0 on): the padded video
    # was encoded, not one frame followed by zero latents.
    assert latent[:, :, 1:].abs().mean() > 1e-3
    assert not torch.equal(latent[0], latent[1])


def test_routing_follows_the_boundary_rule_step_by_step(model, tiny_i2v):
    """(b) Every step of the tiny schedule reaches the expert the rule names; both experts serve; t at the
    boundary goes to the high-noise expert."""
    boundary = int(json.loads((tiny_i2v / "model_index.json").read_text())["boundary_ratio"] * 1000)
    assert model.boundary == boundary == 875
    sigmas = sigma_schedule(8, 5.0)
    expected = [
        "high" if float(torch.tensor(float(s), dtype=torch.float32)) * 1000 >= 875 else "low" for s in sigmas[:-1]
    ]
    assert expected == ["high"] * 4 + ["low"] * 4
    assert expert_schedule(sigmas, model.boundary, model.loaded) == expected
    embeds = model.encode_prompts(["a red square moves right"])
    condition = model.encode_first_frames(images(1), FRAMES)
    x = noise(model, 0)
    seen, handles = count_calls(model.experts)
    try:
        for i, (sigma, sigma_next) in enumerate(zip(sigmas[:-1].tolist(), sigmas[1:].tolist())):
            v = model.velocity(model.experts, x, sigma, embeds, condition=condition)
            assert seen[i:] == [expected[i]]
            x = x + (sigma_next - sigma) * v
        seen.clear()
        model.velocity(model.experts, x, 0.5, embeds, 3.0, condition=condition)
        assert seen == ["low", "low"]  # both branches of guidance on the same expert
        at, below = 0.875, float(np.nextafter(np.float32(0.875), np.float32(0)))
        assert timestep_of(at) == 875.0 and timestep_of(below) < 875.0
        seen.clear()
        model.velocity(model.experts, x, at, embeds, condition=condition)
        model.velocity(model.experts, x, below, embeds, condition=condition)
        assert seen == ["high", "low"]
    finally:
        for handle in handles:
            handle.remove()


def test_routing_rule_matches_the_reference_facts(tmp_path):
    index = tmp_path / "model_index.json"
    index.write_text(json.dumps({"boundary_ratio": None}))
    assert boundary_of(tmp_path) == (0.9, 900)
    index.write_text("{}")
    assert boundary_of(tmp_path) == (0.9, 900)
    # docs/reference-system.md#a14b: shift 5, 30 steps, boundary 900: steps 0-10 high noise, 11-29 low noise.
    assert expert_schedule(sigma_schedule(30, 5.0), 900, ("high", "low")) == ["high"] * 11 + ["low"] * 19
    assert route(900.0, 900, ("high", "low")) == "high" and route(899.9999, 900, ("high", "low")) == "low"
    # The float32 sigma 0.9 is 0.899999976: its unrounded t falls below 900, so it goes to the low-noise expert.
    assert timestep_of(0.9) < 900 and route(timestep_of(0.9), 900, ("high", "low")) == "low"
    assert route(1000.0, 900, ("low",)) == "low" and route(0.0, 900, ("high",)) == "high"
    for bad in (0, 1.5, "0.9", True):
        index.write_text(json.dumps({"boundary_ratio": bad}))
        with pytest.raises(ConfigError, match="boundary_ratio"):
            boundary_of(tmp_path)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_velocity_equals_the_diffusers_pipeline_call(model, pipe, guidance):
    """(c) Each step of diffusers' own I2V denoising loop, captured at the transformer: our velocity on the same
    latent, timestep and embeddings equals what the pipeline's expert returned (guided as diffusers guides)."""
    from PIL import Image

    image = images(1, seed=3)[0]
    embeds = model.encode_prompts(["a blue circle fills"])
    calls = []

    def hook(name):
        def record(_, args, kwargs, out):
            calls.append((name, kwargs["hidden_states"], kwargs["timestep"], kwargs["encoder_hidden_states"], out[0]))

        return record

    handles = [pipe.transformer.register_forward_hook(hook("high"), with_kwargs=True)]
    handles.append(pipe.transformer_2.register_forward_hook(hook("low"), with_kwargs=True))
    try:
        pipe(
            image=Image.fromarray(image),
            prompt_embeds=embeds,
            negative_prompt_embeds=torch.zeros_like(embeds) if guidance > 1 else None,
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            num_inference_steps=6 if guidance == 1 else 4,
            guidance_scale=guidance,
            latents=noise(model, 1),
            output_type="latent",
        )
    finally:
        for handle in handles:
            handle.remove()
    per_step = 2 if guidance > 1 else 1
    steps = [calls[i : i + per_step] for i in range(0, len(calls), per_step)]
    assert {c[0] for c in calls} == {"high", "low"}
    condition = model.encode_first_frames(image[None], FRAMES)
    for step in steps:
        name, hidden, timestep, text, cond_out = step[0]
        assert timestep.shape == (1,) and torch.equal(text, embeds)
        torch.testing.assert_close(hidden[:, 16:], condition, rtol=0, atol=0)
        sigma = timestep.item() / 1000
        assert np.float32(timestep_of(sigma)) == timestep.item() and model.expert_for(timestep_of(sigma)) == name
        theirs = cond_out if guidance == 1 else step[1][4] + guidance * (cond_out - step[1][4])
        ours = model.velocity(model.experts, hidden[:, :16], sigma, embeds, guidance, condition=condition)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("experts", ["high", "low"])
def test_one_expert_loads_alone_and_serves_every_step(tiny_i2v, monkeypatch, experts):
    """(d) train.experts high / low: only that transformer is read from disk, and it serves all steps."""
    from diffusers import WanTransformer3DModel

    loads = []
    original = WanTransformer3DModel.from_pretrained.__func__

    def spy(cls, path, *args, **kwargs):
        loads.append(path.name)
        return original(cls, path, *args, **kwargs)

    monkeypatch.setattr(WanTransformer3DModel, "from_pretrained", classmethod(spy))
    single = WanI2VA14B(tiny_i2v, CPU, max_text_tokens=32, experts=experts)
    folder = {"high": "transformer", "low": "transformer_2"}[experts]
    assert loads == [folder] and list(single.experts) == [experts] and single.loaded == (experts,)
    assert (single.transformer is None) == (experts == "low") and (single.transformer_2 is None) == (experts == "high")
    embeds = single.encode_prompts(["a bar grows"])
    condition = single.encode_first_frames(images(1), FRAMES)
    seen, handles = count_calls(single.experts)
    try:
        for sigma in sigma_schedule(8, 5.0)[:-1].tolist():
            single.velocity(single.experts, noise(single, 2), sigma, embeds, condition=condition)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == [experts] * 8


def test_missing_low_noise_expert_is_refused_unless_training_high(tiny_i2v, tmp_path):
    model_dir = tmp_path / "one-expert"
    shutil.copytree(tiny_i2v, model_dir)
    index = json.loads((model_dir / "model_index.json").read_text())
    index["transformer_2"] = [None, None]
    (model_dir / "model_index.json").write_text(json.dumps(index))
    for experts in ("both", "low"):
        with pytest.raises(ConfigError, match="no transformer_2"):
            WanI2VA14B(model_dir, CPU, max_text_tokens=32, experts=experts)
    assert list(WanI2VA14B(model_dir, CPU, max_text_tokens=32, experts="high").experts) == ["high"]
    with pytest.raises(ConfigError, match="train.experts"):
        WanI2VA14B(tiny_i2v, CPU, experts="middle")
    with pytest.raises(ConfigError, match="model.kind"):
        WanI2VA14B(tiny_i2v, CPU, kind="ti2v")


def test_ti2v_model_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="in/out_channels = 48/48"):
        WanI2VA14B(tiny_model, CPU, experts="high")


def test_geometry_and_decode(model):
    geometry = model.geometry(FRAMES, HEIGHT, WIDTH)
    assert geometry.shape == (16, 3, 4, 6) and geometry.patch == (1, 2, 2)
    video = model.decode(torch.zeros(1, *geometry.shape))
    assert video.shape == (1, FRAMES, HEIGHT, WIDTH, 3) and video.dtype == np.uint8
    with pytest.raises(ConfigError, match="num_frames"):
        model.geometry(10, HEIGHT, WIDTH)
    with pytest.raises(ConfigError, match="multiples of 16"):
        model.geometry(FRAMES, 40, WIDTH)


def test_bf16_compute_hands_one_bf16_timestep_per_sample_and_36_channels(tiny_i2v):
    """Under bf16 compute the reference casts the scalar timestep to bf16: t = 937.5 reaches the expert as 936."""
    bf16 = WanI2VA14B(tiny_i2v, CPU, compute_dtype="bfloat16", max_text_tokens=32)
    seen = []
    handle = bf16.transformer.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append((kwargs["hidden_states"], kwargs["timestep"])), with_kwargs=True
    )
    try:
        condition = bf16.encode_first_frames(images(2), FRAMES)
        x = torch.cat([noise(bf16, 4), noise(bf16, 5)]).to(bf16.trajectory_dtype)
        v = bf16.velocity(bf16.experts, x, 0.9375, bf16.encode_prompts(["a", "b"]), condition=condition)
    finally:
        handle.remove()
    ((hidden, timestep),) = seen
    assert hidden.shape == (2, 36, 3, 4, 6) and hidden.dtype == torch.bfloat16
    assert timestep.dtype == torch.bfloat16 and timestep.tolist() == [936.0, 936.0]
    assert v.dtype == torch.float32 and v.shape == x.shape


def test_the_default_condition_is_rounded_as_the_reference(tiny_i2v):
    """model.condition_dtype bfloat16 (the default, as the reference): pixels scaled in bf16, the VAE's latent
    normalised in its dtype by mean and the reciprocal std, then rounded to bf16; float32 is diffusers' arithmetic,
    and the two differ (by bf16 rounding)."""
    reference = WanI2VA14B(tiny_i2v, CPU, max_text_tokens=32)
    precise = WanI2VA14B(tiny_i2v, CPU, max_text_tokens=32, condition_dtype="float32")
    frames = images(2)
    ours = reference.encode_first_frames(frames, FRAMES)
    pixels = torch.from_numpy(frames).to(torch.bfloat16).div(127.5).sub(1.0).permute(0, 3, 1, 2)
    expected = []
    for image in pixels:
        video = torch.zeros(1, 3, FRAMES, *image.shape[1:], dtype=torch.bfloat16)
        video[:, :, 0] = image
        latent = reference.vae.encode(video.float()).latent_dist.mode()
        mean, inv = reference.latents_mean, 1.0 / reference.latents_std
        expected.append(((latent - mean) * inv).to(torch.bfloat16).float())
    assert torch.equal(ours[:, 4:], torch.cat(expected))
    assert torch.equal(ours[:, 4:].to(torch.bfloat16).float(), ours[:, 4:])  # bf16 values
    assert not torch.equal(ours, precise.encode_first_frames(frames, FRAMES))
