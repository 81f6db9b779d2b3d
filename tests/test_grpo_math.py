"""Samplers, advantages, loss, timestep selection and prompt assignment against closed forms; the schedule's
flow shift, read from the model's scheduler config by training, the matrix and preflight."""

import json
import math

import numpy as np
import pytest
import torch

from videogrpo.grpo import assignment, samplers
from videogrpo.grpo.advantages import group_advantages
from videogrpo.grpo.draws import counter_seed
from videogrpo.grpo.loss import ppo_loss
from videogrpo.grpo.sde_window import trained_timesteps

from conftest import REPO

SHAPE = (3, 4, 5, 2, 2)  # [B, C, F, h, w]


def draw(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE) for _ in range(3)]


def reference(sampler, x, v, eps, s, s_next, eta):
    """docs/reference-system.md#grpo in float64 NumPy, written from the formulas (not from samplers.py):
    (x', mu, std, per-sample log p over frames 1..). eta may be per sample."""
    eta = np.asarray(eta, dtype=np.float64).reshape(-1, *([1] * (x.ndim - 1)))
    d = s_next - s
    if sampler == "flowcps":
        std = s_next * np.sin(eta * math.pi / 2)
        x0, x1 = x - s * v, x + (1 - s) * v
        mu = (1 - s_next) * x0 + np.sqrt(s_next**2 - std**2) * x1
    elif sampler == "dancegrpo":
        std = eta * math.sqrt(s - s_next)
        mu = x + d * (v + eta**2 * (x + (1 - s) * v) / (2 * s))
    else:  # flowgrpo: s_t = sigma; flowgrpo_sde: eta sqrt(sigma / (1 - sigma)), sigma' in the root where sigma = 1
        # (sigma' as float32 holds it, as the sampler and its authors' scheduler do: 1 - sigma' is 0.004 at step 0,
        # so sigma''s float32 rounding alone moves the root by 1e-5)
        st = s if sampler == "flowgrpo" else eta * np.sqrt(s / (1 - (float(np.float32(s_next)) if s == 1 else s)))
        mu = x * (1 + st**2 * d / (2 * s)) + v * (1 + st**2 * (1 - s) / (2 * s)) * d
        std = np.broadcast_to(st * math.sqrt(-d), eta.shape).copy()
    xn = mu + std * eps
    diff = (xn - mu)[:, :, 1:]
    if sampler == "flowcps":
        logp = -(diff**2).reshape(len(x), -1).mean(1)
    else:
        logp = (-(diff**2) / (2 * std**2) - np.log(std) - math.log(math.sqrt(2 * math.pi))).reshape(len(x), -1).mean(1)
    return xn, mu, std, logp


def reference_kl(sampler, mu, mu_ref, std):
    mse = ((mu - mu_ref)[:, :, 1:] ** 2).reshape(len(mu), -1).mean(1)
    return float(mse.mean() if sampler == "flowcps" else (mse / (2 * std.reshape(-1) ** 2)).mean())


def frame_mask():
    mask = torch.ones(SHAPE[2])
    mask[0] = 0
    return mask


def t(a):
    return torch.tensor(a, dtype=torch.float32)


@pytest.mark.parametrize(
    "sampler,eta",
    [
        ("flowcps", 0.7),
        ("flowcps", [0.1, 0.5, 1.0]),
        ("dancegrpo", 0.3),
        ("dancegrpo", [0.2, 0.3, 0.9]),
        ("flowgrpo", 0.0),
        ("flowgrpo_sde", 0.7),
        ("flowgrpo_sde", [0.2, 0.7, 1.0]),
    ],
)
@pytest.mark.parametrize("index", [0, 5, 28])
def test_transition_mean_std_and_log_prob_match_the_closed_form(sampler, eta, index):
    sigmas = samplers.sigma_schedule(30, 5.0)
    s, s_next = float(sigmas[index]), float(sigmas[index + 1])
    x, v, eps = draw(index)
    eta_arg = t(eta) if isinstance(eta, list) else eta
    mu, std = samplers.transition(sampler, t(x), t(v), s, s_next, eta_arg)
    xn, mu2, logp = samplers.step(sampler, t(x), t(v), s, s_next, eta_arg, t(eps), frame_mask())
    rx, rmu, rstd, rlogp = reference(sampler, x, v, eps, s, s_next, eta if isinstance(eta, list) else [eta] * 3)
    np.testing.assert_allclose(mu.numpy(), rmu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.broadcast_to(std.numpy(), rstd.shape), rstd, rtol=1e-6)
    torch.testing.assert_close(mu2, mu)
    np.testing.assert_allclose(xn.numpy(), rx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp.numpy(), rlogp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "sampler,eta", [("flowcps", 0.7), ("dancegrpo", 0.3), ("flowgrpo", 0.0), ("flowgrpo_sde", 0.7)]
)
def test_kl_term_matches_the_closed_form(sampler, eta):
    """mean((mu - mu_ref)^2) for Flow-CPS; divided by 2 s^2 for DanceGRPO and Flow-GRPO."""
    sigmas = samplers.sigma_schedule(30, 5.0)
    s, s_next = float(sigmas[7]), float(sigmas[8])
    x, v, v_ref = draw(3)
    mu, std = samplers.transition(sampler, t(x), t(v), s, s_next, torch.full((3,), eta))
    mu_ref, _ = samplers.transition(sampler, t(x), t(v_ref), s, s_next, torch.full((3,), eta))
    _, rmu, rstd, _ = reference(sampler, x, v, 0 * x, s, s_next, [eta] * 3)
    _, rmu_ref, _, _ = reference(sampler, x, v_ref, 0 * x, s, s_next, [eta] * 3)
    kl = samplers.kl_divergence(sampler, mu, mu_ref, std, frame_mask())
    assert kl.item() == pytest.approx(reference_kl(sampler, rmu, rmu_ref, rstd), rel=1e-5)
    if sampler != "flowcps":  # the Gaussian samplers really do scale by the variance
        assert kl.item() != pytest.approx(reference_kl("flowcps", rmu, rmu_ref, rstd), rel=1e-3)


def test_flowcps_near_eta_one_keeps_float32_precision():
    """sqrt(sigma'^2 - s^2) computed as a difference of squares in float32 is off by ~4e-4 at eta 0.9999."""
    sigmas = samplers.sigma_schedule(30, 5.0)
    x, v, _ = draw(4)
    for index in (0, 10, 27):
        s, s_next = float(sigmas[index]), float(sigmas[index + 1])
        mu, _ = samplers.transition("flowcps", t(x), t(v), s, s_next, 0.9999)
        _, rmu, _, _ = reference("flowcps", x, v, 0 * x, s, s_next, [0.9999] * 3)
        assert np.abs(mu.numpy() - rmu).max() < 1e-6


def test_a_bfloat16_trajectory_stores_bf16_and_scores_the_stored_latent():
    """The reference keeps the trajectory in bf16 and takes log p of the rounded x' (so replay sees the same)."""
    sigmas = samplers.sigma_schedule(30, 5.0)
    x, v, eps = draw(5)
    xn, mu, logp = samplers.step(
        "dancegrpo", t(x), t(v), float(sigmas[3]), float(sigmas[4]), 0.3, t(eps), frame_mask(), torch.bfloat16
    )
    assert xn.dtype == torch.bfloat16
    _, std = samplers.transition("dancegrpo", t(x), t(v), float(sigmas[3]), float(sigmas[4]), 0.3)
    torch.testing.assert_close(logp, samplers.log_prob("dancegrpo", xn.float(), mu, std, frame_mask()))
    full, _, _ = samplers.step("dancegrpo", t(x), t(v), float(sigmas[3]), float(sigmas[4]), 0.3, t(eps))
    assert torch.equal(xn, full.to(torch.bfloat16)) and not torch.equal(xn.float(), full)


def test_flowcps_at_eta_zero_is_the_euler_step():
    x, v, eps = (torch.tensor(a, dtype=torch.float32) for a in draw(1))
    xn, mu, logp = samplers.step("flowcps", x, v, 0.8, 0.6, 0.0, eps)
    torch.testing.assert_close(xn, x + (0.6 - 0.8) * v, rtol=1e-6, atol=1e-6)
    assert torch.all(logp == 0)


def test_schedule_runs_from_one_to_zero_with_shift():
    sigmas = samplers.sigma_schedule(30, 5.0)
    assert len(sigmas) == 31 and sigmas[0] == 1 and sigmas[-1] == 0
    t = 0.5
    assert float(sigmas[15]) == pytest.approx(5 * t / (1 + 4 * t))
    assert torch.all(sigmas[1:] < sigmas[:-1])


def test_group_advantages_closed_form():
    rewards = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.2, 0.2, 0.2, 0.2]])
    adv = group_advantages(rewards)
    r = rewards[0].double()
    expected = (r - r.mean()) / (r.std(unbiased=True) + 1e-4)
    torch.testing.assert_close(adv[0], expected.float())
    assert torch.all(adv[1] == 0)
    assert group_advantages(torch.tensor([[0.0, 0.0, 0.0, 1000.0]])).max() <= 5.0


def test_ppo_loss_on_policy_is_minus_mean_advantage():
    logp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 2.0])
    loss, stats = ppo_loss(logp, logp.detach().clone(), adv, 1e-4)
    assert loss.item() == pytest.approx(-adv.mean().item())
    assert stats.ratio_mean == 1.0 and stats.ratio_abs_max == 0.0 and stats.clip_fraction == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 3)


def test_ppo_loss_clips_far_ratios():
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))
    adv = torch.tensor([1.0, -1.0])
    loss, stats = ppo_loss(new, old, adv, 0.2)
    # max(-A rho, -A clip(rho)) per sample: max(-1.5, -1.2) = -1.2 and max(0.5, 0.8) = 0.8.
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert stats.clip_fraction == 1.0


def test_trained_timesteps_keep_seventeen_of_twenty_nine_sorted_and_seeded():
    a = trained_timesteps(30, 0.6, 42, 0)
    assert len(a) == 17 and a == sorted(a) and max(a) <= 28
    assert a == trained_timesteps(30, 0.6, 42, 0)
    assert a != trained_timesteps(30, 0.6, 42, 1)


def test_trained_timestep_count_follows_the_reference_arithmetic():
    """max(1, int((T - 1) x fraction)): int() of the float product, so 100 x 0.29 keeps 28; never none."""
    assert len(trained_timesteps(101, 0.29, 0, 0)) == 28
    assert trained_timesteps(30, 0.03, 0, 5) and len(trained_timesteps(30, 0.03, 0, 5)) == 1
    assert trained_timesteps(30, 1.0, 0, 0) == list(range(29))


def test_learning_rate_warms_up_from_zero_then_decays_by_cosine():
    from videogrpo.grpo.lr_schedule import learning_rate

    peak, warmup, total = 5e-6, 5, 7728
    assert [learning_rate(k, warmup, total, peak) for k in range(6)] == pytest.approx([0, 1e-6, 2e-6, 3e-6, 4e-6, peak])
    assert learning_rate(0, warmup, total, peak) == 0.0  # the first update does not move the weights
    k = 3000
    assert learning_rate(k, warmup, total, peak) == pytest.approx(
        peak * 0.5 * (1 + math.cos(math.pi * (k - warmup) / (total - warmup))), rel=1e-12
    )
    assert 0 < learning_rate(total - 1, warmup, total, peak) < peak * 1e-6  # nearly 0 at the last update
    assert learning_rate(0, 0, 4, 1.0) == 1.0  # no warm-up: the cosine starts at the peak
    # train.lr_schedule constant (the published algorithms' authors): the same warm-up, then the peak throughout.
    held = [learning_rate(k, warmup, total, peak, "constant") for k in (0, 2, 5, 3000, total - 1)]
    assert held == [0.0, pytest.approx(2e-6), peak, peak, peak]


def test_counter_seeds_differ_per_counter():
    assert counter_seed(1, 2, 3) != counter_seed(1, 2, 4) and counter_seed(1, 2, 3) == counter_seed(1, 2, 3)


def test_shared_prompt_assignment_of_the_5b_reference_topology():
    world, prompts, group = 128, 32, 32
    owned = {}
    for rank in range(world):
        work = assignment.shared_prompt_work(rank, world, prompts, group)
        assert work.prompt_slots == (rank % prompts,)
        assert len(work.group_indices) == 8
        assert work.group_indices == tuple(range(rank // prompts, group, 4))
        for g in work.group_indices:
            assert (work.prompt_slots[0], g) not in owned
            owned[(work.prompt_slots[0], g)] = rank
    assert len(owned) == prompts * group  # every member of every group exactly once


@pytest.mark.parametrize(
    "world,prompts,group,message",
    [
        (100, 32, 32, "world size 100 is not a multiple of the 32 prompts"),
        (128, 32, 30, "group size 30 is not a multiple of the 4 ranks per prompt"),
    ],
)
def test_inconsistent_topologies_are_rejected(world, prompts, group, message):
    with pytest.raises(ValueError, match=message):
        assignment.shared_prompt_work(0, world, prompts, group)


def test_replica_assignment_gives_whole_groups_strided_over_replicas():
    """The A14B recipe: 8 ranks, TP 2, 4 replicas of 4 prompts, 16 per step: rank 5 is replica 2 (TP pair {4, 5})
    and takes positions 2, 6, 10, 14 with every group member; each position goes to exactly one replica."""
    work = assignment.replica_work(rank=5, world=8, tensor_parallel=2, batch_size=4, group_size=16)
    assert work.prompt_slots == (2, 6, 10, 14) and work.group_indices == tuple(range(16))
    peer = assignment.replica_work(rank=4, world=8, tensor_parallel=2, batch_size=4, group_size=16)
    assert peer == work
    slots = [s for r in range(0, 8, 2) for s in assignment.replica_work(r, 8, 2, 4, 16).prompt_slots]
    assert sorted(slots) == list(range(16))


# ---- the flow shift of the schedule: the model's (docs/reference-system.md#a14b), one function for every user ----


def scheduler_dir(tmp_path, config):
    (tmp_path / "scheduler").mkdir(parents=True)
    (tmp_path / "scheduler/scheduler_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    "config, shift, key",
    [
        ({"flow_shift": 3.0, "shift": 1.0}, 3.0, "flow_shift"),
        ({"flow_shift": None, "shift": 12}, 12.0, "shift"),
        ({"num_train_timesteps": 1000}, 5.0, None),
    ],
    ids=["flow_shift-first", "else-shift", "else-5"],
)
def test_the_flow_shift_is_read_from_the_models_scheduler_config(tmp_path, config, shift, key):
    from videogrpo.models.wan import scheduler_flow_shift

    found, source = scheduler_flow_shift(scheduler_dir(tmp_path, config))
    path = tmp_path / "scheduler/scheduler_config.json"
    assert found == shift
    assert source == (f"from {path}: {key}" if key else f"the reference's default: no flow_shift or shift in {path}")


def test_a_model_without_a_scheduler_config_samples_at_five_and_a_bad_value_is_refused(tmp_path):
    from videogrpo.errors import ConfigError
    from videogrpo.models.wan import scheduler_flow_shift

    assert scheduler_flow_shift(tmp_path / "none") == (
        5.0,
        f"the reference's default: no {tmp_path}/none/scheduler/scheduler_config.json",
    )
    with pytest.raises(ConfigError, match=r"scheduler_config.json: flow_shift = -1 is not a positive number"):
        scheduler_flow_shift(scheduler_dir(tmp_path / "bad", {"flow_shift": -1}))


@pytest.mark.parametrize("override", [None, 2.5])
def test_preflight_says_which_flow_shift_is_used(tmp_path, override):
    from videogrpo import config
    from videogrpo.preflight.checks import check_flow_shift

    model = scheduler_dir(tmp_path, {"shift": 3.0})
    check = check_flow_shift(config.from_dict({"grpo": {"shift": override}}, partial=True), model)
    assert check.ok and check.name == "flow_shift"
    expected = (
        "flow shift 2.5 (grpo.shift override)"
        if override
        else (f"flow shift 3.0 (from {model}/scheduler/scheduler_config.json: shift)")
    )
    assert check.detail == expected


class Sampled(Exception):
    pass


def test_the_matrix_cells_sample_with_the_models_flow_shift(tiny_model, dataset, tmp_path, monkeypatch):
    """Every matrix cell, the held-out check's included, samples as its model's scheduler says; a grpo.shift
    override is training's alone."""
    import yaml

    from videogrpo import config
    from videogrpo.data.dataset import load_split
    from videogrpo.evaluation import generate
    from videogrpo.evaluation.evalset import EvalSample

    from harness import model_with_scheduler

    model_dir = model_with_scheduler(tiny_model, tmp_path / "model", {"flow_shift": 3.0})
    cfg = config.from_dict(yaml.safe_load((REPO / "config/config.yaml").read_text()), partial=True)

    def caught(*args, **kwargs):
        raise Sampled(args, kwargs)

    monkeypatch.setattr(generate, "generate_video", caught)
    samples = load_split(dataset, "heldout")
    sample = EvalSample(0, "In-Domain_50", samples[0].task, "00000", "x")
    for shift in (None, 2.5):
        cfg.grpo.shift = shift
        for sampler in ("euler", "flowcps-0.7"):
            with pytest.raises(Sampled) as sampled:
                generate.generate_rank(
                    0, 1, cfg, model_dir, None, tmp_path / "tree", [sample], sampler, tmp_path / "cell", "cpu"
                )
            assert sampled.value.args[0][-1] == 3.0, (shift, sampler)
