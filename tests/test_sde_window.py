"""The SDE window (grpo.sde_window_size > 0, docs/options.md#sde-window): where it sits per batch (Flow-GRPO-Fast's
random start, MixGRPO's sliding one), the rollout's ODE steps outside it, and a run that trains its steps only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.grpo import samplers, sde_window
from videogrpo.grpo.rollout import frame_mask, rollout, trained_timesteps

from harness import metrics, solo_config, train_in_process


def grpo(**fields) -> SimpleNamespace:
    base = dict(
        algorithm="grpo",
        sampling_steps=10,
        sampler="flowcps",
        timestep_fraction=0.6,
        sde_window_size=3,
        sde_window_range=None,
        sde_window_mode="random",
        sde_window_stride=1,
        sde_window_shift_every=25,
    )
    return SimpleNamespace(**{**base, **fields})


def test_a_random_window_is_drawn_per_batch_from_the_range_alike_on_every_call():
    g = grpo(sde_window_range=[0, 5])  # starts 0, 1 or 2, as Flow-GRPO-Fast's randint(0, 5 - 3)
    windows = [sde_window.window(g, 42, batch) for batch in range(60)]
    assert windows == [sde_window.window(g, 42, batch) for batch in range(60)]  # keyed, not a stream
    assert {start for start, _ in windows} == {0, 1, 2}
    assert all(end - start == 3 for start, end in windows)
    assert windows != [sde_window.window(g, 43, batch) for batch in range(60)]  # the run's seed keys it
    assert sde_window.replayed_steps(g, 42, 7, 3) == list(range(*windows[7]))
    assert sde_window.trained_steps(g) == 3
    assert sde_window.describe(g) == (
        "SDE window: 3 of 10 denoising steps sampled with flowcps and trained, a start drawn per batch from 0..2; "
        "the other steps take the Euler ODE"
    )


def test_a_sliding_window_moves_by_its_stride_is_cut_at_the_range_end_and_starts_over_as_mixgrpo():
    g = grpo(sde_window_mode="sliding", sde_window_size=3, sde_window_range=[1, 8], sde_window_stride=2)
    g.sde_window_shift_every = 2
    windows = [sde_window.window(g, 0, batch) for batch in range(20)]
    # starts 1, 3, 5, 7 (up to 8, as MixGRPO's schedule: a start past 8 rolls back), the window cut at 8
    assert windows[::2] == [(1, 4), (3, 6), (5, 8), (7, 8), (1, 4), (3, 6), (5, 8), (7, 8), (1, 4), (3, 6)]
    assert windows[1::2] == windows[::2]
    g.sde_window_stride = 1  # at the start 8 the window holds no step (their empty list of timesteps)
    assert [sde_window.window(g, 0, batch) for batch in range(12, 18, 2)] == [(7, 8), (8, 8), (1, 4)]
    assert sde_window.replayed_steps(g, 0, 14, 1) == []


def test_without_a_window_the_reference_steps_are_trained():
    g = grpo(sde_window_size=0)
    assert sde_window.window(g, 42, 0) is None
    assert sde_window.replayed_steps(g, 42, 0, 5) == trained_timesteps(10, 0.6, 42, 5)
    assert sde_window.trained_steps(g) == len(trained_timesteps(10, 0.6, 42, 5)) == 5


class Field:
    """A stand-in for the model in `rollout`: a smooth velocity field over unpinned I2V-style latents."""

    pins_first_frame = False
    trajectory_dtype = torch.float32

    def velocity(self, transformer, x, sigma, embeds, guidance_scale, condition=None):
        return torch.tanh(x) * (1 + sigma) - 0.3


@pytest.mark.parametrize("sampler", ["flowcps", "dancegrpo"])
def test_the_rollout_samples_the_window_with_the_sde_and_every_other_step_with_the_euler_ode(sampler):
    torch.manual_seed(0)
    sigmas = samplers.sigma_schedule(6, 3.0)
    init = torch.randn(2, 4, 2, 3, 3)
    noise = [torch.randn_like(init) for _ in range(6)]
    etas = torch.full((2,), 0.7)
    model = Field()
    out = rollout(model, None, None, None, init, sigmas, sampler, etas, lambda i: noise[i], window=(2, 4))
    whole = rollout(model, None, None, None, init, sigmas, sampler, etas, lambda i: noise[i])
    x = init
    for i in range(6):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        v = model.velocity(None, x, s, None, 1.0)
        if 2 <= i < 4:
            expected, _, logp = samplers.step(sampler, x, v, s, s_next, etas, noise[i], frame_mask(2, x.device, False))
            assert torch.equal(out.log_probs[:, i], logp)
        else:
            expected = x + (s_next - s) * v
            assert not out.log_probs[:, i].any()  # outside the window: no log-probability, never replayed
        assert torch.allclose(out.latents[:, i + 1], expected, atol=1e-6), i
        x = out.latents[:, i + 1]
    every = rollout(model, None, None, None, init, sigmas, sampler, etas, lambda i: noise[i], window=(0, 6))
    assert torch.equal(every.latents, whole.latents)  # a window over every step is the reference's rollout
    assert not torch.equal(out.latents[:, 1], whole.latents[:, 1])  # step 0 is an SDE step only without the window


def test_the_window_is_an_option_refused_where_it_cannot_fit():
    with pytest.raises(ConfigError, match=r"grpo.sde_window_size = 9: larger than its range \[0, 8\)"):
        config.from_dict({"grpo": {"sde_window_size": 9, "sampling_steps": 8}}, partial=True)
    with pytest.raises(ConfigError, match="grpo.sde_window_range = \\[3, 2\\]"):
        config.from_dict({"grpo": {"sde_window_size": 1, "sde_window_range": [3, 2]}}, partial=True)
    with pytest.raises(ConfigError, match="grpo.sde_window_mode = 'fixed': must be one of random, sliding"):
        config.from_dict({"grpo": {"sde_window_size": 1, "sde_window_mode": "fixed"}}, partial=True)


@pytest.mark.parametrize("delayed", [False, True], ids=["synchronous", "delayed replay"])
def test_a_run_with_a_window_replays_its_steps_only_on_policy_first(delayed, tiny_model, dataset, tmp_path):
    """Two steps of eight trained per update (the reference's fraction would train four); the first update replays
    its window on-policy (ratio exactly 1); the window makes a new run."""
    cfg = solo_config(
        train={"max_steps": 2, "save_steps": 1},
        grpo={"sde_window_size": 2, "sde_window_range": [0, 4], "delayed_replay": delayed},
    )
    rows = metrics(train_in_process(cfg, tmp_path, tiny_model, dataset))
    assert [m["trained_timesteps"] for m in rows] == [2, 2]
    first = rows[0]
    assert first["ppo_ratio_mean"] == 1.0 and first["ppo_ratio_abs_max"] == 0.0
    reference = solo_config(train={"max_steps": 2, "save_steps": 1}, grpo={"delayed_replay": delayed})
    assert config.run_identity(config.from_dict(cfg)) != config.run_identity(config.from_dict(reference))


def test_simulate_accepts_a_window_at_the_5b_recipes_world_size(repo):
    """The window keeps the recipe's shapes and layout: 128 simulated ranks' config checks and rank 0's shards."""
    argv = [str(Path(sys.executable).parent / "videogrpo"), "simulate", "--configfile", "config/recipes/rl_5b_cps.yaml"]
    argv += ["--set", "grpo.sde_window_size=4", "grpo.sde_window_range=[0,15]", "--ranks", "0", "--no-steps"]
    out = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "world 128" in out.stdout and "1 ranks of 128 checked" in out.stdout


def test_a_sliding_windows_empty_tail_trains_nothing_and_says_so(tiny_model, dataset, tmp_path, capfd):
    """Starts 0, 2, 4 of the range [0, 4): the third batch's window starts at 4 and holds no step (MixGRPO's
    schedule), so its update replays nothing and steps no optimizer; the run goes on."""
    grpo = {"sde_window_size": 2, "sde_window_range": [0, 4], "sde_window_mode": "sliding", "sde_window_stride": 2,
            "sde_window_shift_every": 1, "delayed_replay": False}  # fmt: skip
    rows = metrics(train_in_process(solo_config(train={"max_steps": 4, "save_steps": 4}, grpo=grpo), tmp_path,
                                    tiny_model, dataset))  # fmt: skip
    assert [m["trained_timesteps"] for m in rows] == [2, 2, 0, 2]
    assert rows[2]["grad_norm"] == 0.0 and rows[2]["policy_loss"] == 0.0 and rows[3]["grad_norm"] > 0
    assert "update 3: batch 2's SDE window holds no step; nothing trained" in capfd.readouterr().err
