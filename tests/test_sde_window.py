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
from videogrpo.grpo.rollout import frame_mask, rollout
from videogrpo.grpo.sde_window import trained_timesteps

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
        sde_window_tail="euler",
        sde_window_tail_ratio=0.4,
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


def test_after_the_window_the_dpm_solver_tail_takes_fewer_re_spaced_steps_and_keeps_only_its_end():
    """MixGRPO-Flash's tail: the steps after a window ending at 4 (of 10) become int(7 x 0.4) = 2 noise levels from
    sigma_4 to 0 (at 0.7: 4). The solver's history starts with the window's last x0 (second order from the tail's
    first step); its last step, to 0, lands on x0. Only the final state is kept; the steps up to the window's end are
    the Euler tail's rollout's."""
    sigmas = samplers.sigma_schedule(10, 3.0)
    init = torch.randn(2, 4, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    noise = [torch.randn_like(init) for _ in range(10)]
    etas, field, calls = torch.full((2,), 0.7), Field(), []

    class Counted(Field):
        def velocity(self, transformer, x, sigma, embeds, guidance_scale, condition=None):
            calls.append(sigma)
            return super().velocity(transformer, x, sigma, embeds, guidance_scale, condition)

    def sample(model, tail=None):
        step_noise = noise.__getitem__
        return rollout(model, None, None, None, init, sigmas, "dancegrpo", etas, step_noise, window=(2, 4), tail=tail)

    def by_hand(tail, before):
        x = euler.latents[:, 4]
        for s, s_next in zip(tail[:-1].tolist(), tail[1:].tolist()):
            x0 = x - s * field.velocity(None, x, s, None, 1.0)
            x, before = samplers.dpm_solver_step(x, x0, s, s_next, before, torch.float32), (x0, s)
        assert torch.equal(x, x0)  # the last step lands on x0
        return x

    euler = sample(field)
    x3, s3 = euler.latents[:, 3], float(sigmas[3])
    window_x0 = (x3 - s3 * field.velocity(None, x3, s3, None, 1.0), s3)
    g = grpo(sampling_steps=10, sde_window_size=2, sde_window_tail="dpm_solver")
    for ratio, levels in ((0.4, 2), (0.7, 4)):
        g.sde_window_tail_ratio = ratio
        tail = sde_window.tail(g, 3.0, (2, 4))
        assert len(tail) == sde_window.tail_points(g, 4) == levels
        assert float(tail[0]) == float(sigmas[4]) and float(tail[-1]) == 0.0
        calls.clear()
        out = sample(Counted(), tail)
        assert len(calls) == sde_window.rollout_forwards(g, (2, 4)) == 4 + levels - 1
        assert calls[4:] == tail[:-1].tolist()
        assert torch.equal(out.latents[:, :5], euler.latents[:, :5]) and torch.equal(out.log_probs, euler.log_probs)
        assert torch.isnan(out.latents[:, 5:-1]).all()  # on no step of the schedule: never replayed
        assert torch.equal(out.latents[:, -1], by_hand(tail, window_x0))
        # The history is used, except where the tail's one step is its last (to 0: first order).
        assert torch.equal(out.latents[:, -1], by_hand(tail, None)) == (levels == 2)
    # A window reaching the last step has no tail; a tail of one level ends at the window's end, as theirs.
    assert sde_window.tail(g, 3.0, (8, 10)) is None and sde_window.rollout_forwards(g, (8, 10)) == 10
    g.sde_window_tail_ratio = 0.2
    one = sde_window.tail(g, 3.0, (2, 4))
    assert len(one) == 1 and sde_window.rollout_forwards(g, (2, 4)) == 4
    assert torch.equal(sample(field, one).latents[:, -1], euler.latents[:, 4])


def test_the_tails_mean_forwards_follow_where_the_window_may_sit():
    g = grpo(sampling_steps=10, sde_window_size=2, sde_window_range=[0, 4], sde_window_tail="euler")
    assert sde_window.mean_rollout_forwards(g) == 10
    g.sde_window_tail, g.sde_window_tail_ratio = "dpm_solver", 0.4
    # random: ends 2, 3, 4 -> 2 + int(3.6) - 1, 3 + int(3.2) - 1, 4 + int(2.8) - 1
    assert sde_window.mean_rollout_forwards(g) == (4 + 5 + 5) / 3
    g.sde_window_mode, g.sde_window_stride = "sliding", 2  # starts 0, 2, 4: ends 2, 4, 4 (cut, then empty)
    assert sde_window.mean_rollout_forwards(g) == (4 + 5 + 5) / 3


def test_the_window_is_an_option_refused_where_it_cannot_fit():
    with pytest.raises(ConfigError, match=r"grpo.sde_window_size = 9: larger than its range \[0, 8\)"):
        config.from_dict({"grpo": {"sde_window_size": 9, "sampling_steps": 8}}, partial=True)
    with pytest.raises(ConfigError, match="grpo.sde_window_range = \\[3, 2\\]"):
        config.from_dict({"grpo": {"sde_window_size": 1, "sde_window_range": [3, 2]}}, partial=True)
    with pytest.raises(ConfigError, match="grpo.sde_window_mode = 'fixed': must be one of random, sliding"):
        config.from_dict({"grpo": {"sde_window_size": 1, "sde_window_mode": "fixed"}}, partial=True)
    with pytest.raises(ConfigError, match="grpo.sde_window_tail = 'dpm_solver' with grpo.sde_window_size = 0"):
        config.from_dict({"grpo": {"sde_window_tail": "dpm_solver"}}, partial=True)
    with pytest.raises(ConfigError, match=r"grpo.sde_window_tail_ratio = 1.5: must be in \(0, 1\]"):
        config.from_dict({"grpo": {"sde_window_size": 1, "sde_window_tail_ratio": 1.5}}, partial=True)
    with pytest.raises(ConfigError, match="grpo.sde_window_tail = 'heun': must be one of euler, dpm_solver"):
        config.from_dict({"grpo": {"sde_window_size": 1, "sde_window_tail": "heun"}}, partial=True)


@pytest.mark.parametrize(
    ("delayed", "tail"),
    [(False, "euler"), (True, "euler"), (False, "dpm_solver")],
    ids=["synchronous", "delayed replay", "dpm-solver tail"],
)
def test_a_run_with_a_window_replays_its_steps_only_on_policy_first(delayed, tail, tiny_model, dataset, tmp_path,
                                                                    capfd):  # fmt: skip
    """Two steps of eight trained per update (the reference's fraction would train four); the first update replays
    its window on-policy (ratio exactly 1); the window makes a new run. The DPM-Solver tail rolls out fewer steps
    after the window, and the replay of the window is the same."""
    cfg = solo_config(
        train={"max_steps": 2, "save_steps": 1},
        grpo={"sde_window_size": 2, "sde_window_range": [0, 4], "delayed_replay": delayed, "sde_window_tail": tail},
    )
    rows = metrics(train_in_process(cfg, tmp_path, tiny_model, dataset))
    said = capfd.readouterr().err
    assert ("taken by DPM-Solver++ (2M)" in said) == (tail == "dpm_solver"), said[-2000:]
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
