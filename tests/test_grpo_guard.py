"""GRPO-Guard (grpo.grpo_guard, docs/options.md#grpo-guard): the normalised log-ratio, its step-independent gradient,
the 1 / (sigma - sigma') reweight, and a run that trains with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.grpo import samplers
from videogrpo.grpo.loss import guard_log_ratio
from videogrpo.grpo.rollout import frame_mask

from harness import metrics, solo_config, train_in_process


def gaussian_step(sampler: str, sigma: float, sigma_next: float, eta):
    """A transition of `sampler` from a random x and v, a next latent drawn from it, and a moved policy's mean."""
    generator = torch.Generator().manual_seed(0)
    x, v = (torch.randn(3, 4, 3, 2, 2, generator=generator, dtype=torch.float64) for _ in range(2))
    mean_old, std = samplers.transition(sampler, x, v, sigma, sigma_next, eta)
    eps = torch.randn(mean_old.shape, generator=generator, dtype=torch.float64)
    x_next = mean_old + std * eps
    delta = 1e-3 * torch.randn(mean_old.shape, generator=generator, dtype=torch.float64)
    return x_next, mean_old.double(), std, eps, delta


@pytest.mark.parametrize(
    ("sampler", "sigma", "sigma_next", "eta"),
    [
        ("dancegrpo", 0.9, 0.8, 0.3),
        ("dancegrpo", 0.3, 0.2, torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)),  # one eta per row
        ("flowgrpo", 0.6, 0.5, 0.0),
        ("flowgrpo", 0.1, 0.05, 0.0),
        ("flowgrpo_sde", 1.0, 0.9, 0.7),  # the first step: its noise level takes sigma' (Flow-GRPO's sigma_max)
        ("flowgrpo_sde", 0.5, 0.4, 0.7),
    ],
)
def test_the_normalised_log_ratio_is_the_noise_times_the_mean_shift_at_every_noise_level(
    sampler, sigma, sigma_next, eta
):
    """(log rho + mean(delta^2) / (2 s^2)) s = mean(eps delta): the mean-shift bias is gone and the step's scale is
    taken out, so its gradient with respect to the policy's mean is eps / D at every step (the raw log-ratio's is
    eps / (s D), which grows without bound as the noise level falls)."""
    x_next, mean_old, std, eps, delta = gaussian_step(sampler, sigma, sigma_next, eta)
    mask = frame_mask(3, torch.device("cpu"))  # frame 0 pinned, as TI2V
    mean_new = (mean_old + delta).requires_grad_(True)
    logp_old = samplers.log_prob(sampler, x_next, mean_old, std, mask).double()
    logp_new = samplers.log_prob(sampler, x_next, mean_new, std, mask)
    raw = logp_new - logp_old
    guarded = guard_log_ratio(logp_new.double(), logp_old, mean_new, mean_old, std, mask)
    expected = samplers.masked_mean(eps * delta, mask)
    assert torch.allclose(guarded.double(), expected, rtol=1e-3, atol=1e-8), (guarded, expected)  # float32 log-probs
    assert (raw.detach() < guarded.detach() / torch.as_tensor(std).flatten()).all()  # the raw ratio is biased low
    (grad,) = torch.autograd.grad(guarded.sum(), mean_new)
    kept = eps[:, :, 1:] / eps[:, :, 1:].numel() * eps.shape[0]  # D: the elements of one row's unpinned frames
    assert torch.allclose(grad[:, :, 1:].double(), kept, rtol=1e-3, atol=1e-9)
    assert not grad[:, :, 0].any()


def test_grpo_guard_is_refused_with_flowcps_whose_log_probability_has_no_variance():
    with pytest.raises(ConfigError, match="grpo.grpo_guard = true with grpo.sampler = 'flowcps'"):
        config.from_dict({"grpo": {"grpo_guard": True, "sampler": "flowcps"}}, partial=True)


def test_a_run_with_grpo_guard_starts_on_policy_and_trains_otherwise_than_without(tiny_model, dataset, tmp_path):
    """DanceGRPO at eta 0.3, two updates: the first ratio is exactly 1 (no mean shift yet); the losses are the
    guarded ones (reweighted by 1 / (sigma - sigma'), so not the reference's); the trajectories keep the means."""
    grpo = {"sampler": "dancegrpo", "eta": 0.3}
    base = dict(train={"max_steps": 2, "save_steps": 1})
    guarded = metrics(train_in_process(solo_config(**base, grpo={**grpo, "grpo_guard": True}), tmp_path / "g",
                                       tiny_model, dataset))  # fmt: skip
    plain = metrics(train_in_process(solo_config(**base, grpo=grpo), tmp_path / "p", tiny_model, dataset))
    assert guarded[0]["ppo_ratio_mean"] == 1.0 and guarded[0]["ppo_ratio_abs_max"] == 0.0
    assert guarded[0]["reward_mean"] == plain[0]["reward_mean"]  # the same rollouts
    assert guarded[0]["grad_norm"] != plain[0]["grad_norm"]  # on policy both losses are 0, their gradients not
    assert guarded[1]["policy_loss"] != plain[1]["policy_loss"]


def test_the_memory_plan_holds_the_transition_means_of_every_step(tiny_model):
    from videogrpo.preflight import memory_plan, model_shape

    from harness import trainer_config

    shape = model_shape.ModelShape.from_model_dir(tiny_model)
    grpo = {"sampler": "dancegrpo", "eta": 0.3}
    off, on = (config.from_dict(trainer_config(grpo={**grpo, "grpo_guard": guard})) for guard in (False, True))
    held = {
        cfg.grpo.grpo_guard: next(
            t.bytes for t in memory_plan.plan_for_config(cfg, shape).terms if t.name == "trajectories"
        )
        for cfg in (off, on)
    }
    # the tiny default: 4 rows held (no offload), 8 steps of a [48, 5, 4, 4] latent in float32
    assert held[True] - held[False] == 4 * 8 * 48 * 5 * 4 * 4 * 4


def test_simulate_accepts_grpo_guard_at_the_5b_recipes_world_size(repo):
    """The recipe's 128 ranks with GRPO-Guard on DanceGRPO: the config checks, rank 0's shards, and a rollout and
    replay step on fake tensors."""
    argv = [str(Path(sys.executable).parent / "videogrpo"), "simulate", "--configfile", "config/recipes/rl_5b_cps.yaml"]
    argv += ["--set", "grpo.grpo_guard=true", "grpo.sampler=dancegrpo", "grpo.eta=0.3", "--ranks", "0"]
    out = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "world 128" in out.stdout and "rollout + replay at step 0" in out.stdout
