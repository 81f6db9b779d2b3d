"""The PPO options beyond the reference: asymmetric clipping (grpo.clip_range_high), groups without signal left
out of the loss (grpo.skip_zero_variance_groups), rollouts without advantage dropped (grpo.drop_zero_advantage)
and the advantages' std (grpo.advantage_std, advantage_std_unbiased, advantage_eps), each off by default
(docs/options.md)."""

from __future__ import annotations

import pytest
import torch

from videogrpo import config
from videogrpo.grpo import minibatches
from videogrpo.grpo.advantages import group_advantages, zero_variance_groups
from videogrpo.grpo.loss import ppo_loss, ppo_objective

from harness import metrics, solo_config, trainer_config, trainer_in_process, weights

RATIOS = torch.tensor([0.5, 0.995, 1.005, 1.05, 1.5], dtype=torch.float64)


def gradients(advantage: float, clip: float, high: float | None) -> torch.Tensor:
    """d loss / d log-prob of each ratio in RATIOS (each row its own term)."""
    logp = RATIOS.log().clone().requires_grad_(True)
    loss, _, _ = ppo_objective(logp, torch.zeros_like(logp), torch.full_like(logp, advantage), clip, high)
    loss.backward()
    return logp.grad


def test_clip_range_high_widens_only_the_upper_bound():
    # Positive advantage: the upper bound decides. Symmetric at 0.01, 1.05 and 1.5 are clipped (no gradient);
    # with clip_range_high 0.1, 1.05 is inside and pulls, 1.5 still clipped.
    symmetric, wide = gradients(1.0, 0.01, None), gradients(1.0, 0.01, 0.1)
    assert (symmetric != 0).tolist() == [True, True, True, False, False]
    assert (wide != 0).tolist() == [True, True, True, True, False]
    # Negative advantage: the lower bound decides, and clip_range_high leaves it where it was.
    assert torch.equal(gradients(-1.0, 0.01, None), gradients(-1.0, 0.01, 0.1))
    assert (gradients(-1.0, 0.01, 0.1) != 0).tolist() == [False, True, True, True, True]
    # null is exactly the symmetric objective, and the clip fraction counts what is outside [1 - c, 1 + c_high].
    logp = RATIOS.log()
    adv = torch.ones_like(logp)
    assert torch.equal(ppo_objective(logp, 0 * logp, adv, 0.01)[0], ppo_objective(logp, 0 * logp, adv, 0.01, 0.01)[0])
    assert ppo_loss(logp, 0 * logp, adv, 0.01)[1].clip_fraction == pytest.approx(3 / 5)
    assert ppo_loss(logp, 0 * logp, adv, 0.01, 0.1)[1].clip_fraction == pytest.approx(2 / 5)


def test_a_group_is_without_signal_only_when_every_member_scored_alike():
    rewards = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.50001], [0.0, 0.0, 0.0]])
    assert zero_variance_groups(rewards).tolist() == [True, False, True]
    assert not group_advantages(rewards)[zero_variance_groups(rewards)].any()  # the reference's zero advantages


class GroupScores:
    """Scores of two prompts of 4 members, rolled out prompt by prompt: the first prompt's group all alike (or both
    groups, `flat`), the second's members 0, 0.25, 0.5, 0.75."""

    def __init__(self, flat: bool = False):
        self.calls, self.flat = 0, flat

    def submit(self, request):
        n, self.calls = self.calls, self.calls + 1
        return 0.5 if self.flat or (n // 4) % 2 == 0 else (n % 4) / 4

    def collect(self, futures: list) -> list[dict]:
        return [{"score": score} for score in futures]

    def close(self, kill: bool = False) -> None:
        pass


TWO_PROMPTS = dict(
    grpo={"prompts_per_step": 2, "shared_prompts": False},
    train={"batch_size": 2, "max_steps": 2, "save_steps": 1000},
)


def run(out, tiny_model, dataset, flat: bool = False, **grpo) -> list[dict]:
    cfg = solo_config(**TWO_PROMPTS)
    cfg["grpo"].update(grpo)
    trainer = trainer_in_process(cfg, out, tiny_model, dataset)
    trainer.scorer.close()
    trainer.scorer = GroupScores(flat)
    trainer.run()
    return metrics(out)


def test_skipped_groups_leave_the_loss_and_the_rest_count_as_the_whole(tiny_model, dataset, tmp_path):
    """One group of two without signal: kept, it dilutes the mean over |T| x G x P terms (the reference); skipped,
    the mean is over the kept group's terms only, so the first update's gradient is exactly twice as large."""
    kept = run(tmp_path / "kept", tiny_model, dataset)
    skipped = run(tmp_path / "skipped", tiny_model, dataset, skip_zero_variance_groups=True)
    assert "zero_variance_groups" not in kept[0]  # off: the reference's metrics
    assert [m["zero_variance_groups"] for m in skipped] == [1, 1]
    assert kept[0]["reward_mean"] == skipped[0]["reward_mean"]  # the same rollouts and rewards
    assert skipped[0]["grad_norm"] == pytest.approx(2 * kept[0]["grad_norm"], rel=1e-5)
    assert kept[0]["grad_norm"] > 0


def test_an_update_whose_groups_all_lack_signal_moves_no_weight_by_gradient(tiny_model, dataset, tmp_path):
    flat = run(tmp_path / "flat", tiny_model, dataset, flat=True, skip_zero_variance_groups=True)
    assert [m["zero_variance_groups"] for m in flat] == [2, 2]
    assert [m["grad_norm"] for m in flat] == [0.0, 0.0]


def test_the_trainer_clips_each_replay_with_the_configured_upper_bound(tiny_model, dataset, tmp_path, monkeypatch):
    """Under delayed replay an update replays a batch rolled out before the previous update, so its ratios leave
    1 +- 1e-6: the replay's objective gets clip_range_high as its upper bound (its arithmetic is pinned above), and
    clip_range_high equal to the clip range is the symmetric run, bit for bit."""
    from videogrpo.grpo import objectives  # where the update's objective reads ppo_loss

    seen = []

    def recording(*args):
        seen.append(args[3:])
        return ppo_loss(*args)

    lr = {"lr": 0.05, "warmup_steps": 0}
    clip = {"delayed_replay": True, "delayed_clip_range": 1e-6}
    symmetric = run_lr(tmp_path / "sym", tiny_model, dataset, lr, **clip)
    same = run_lr(tmp_path / "same", tiny_model, dataset, lr, **clip, clip_range_high=1e-6)
    assert weights(same) == weights(symmetric)
    assert max(m["ppo_clip_fraction"] for m in metrics(symmetric)) > 0  # ratios outside the clip range
    monkeypatch.setattr(objectives, "ppo_loss", recording)
    run_lr(tmp_path / "wide", tiny_model, dataset, lr, **clip, clip_range_high=0.5)
    assert seen and set(seen) == {(1e-6, 0.5)}


def run_lr(out, tiny_model, dataset, train: dict, **grpo):
    """The tiny default (one prompt per step, the stand-in EvalKit's rewards) for 4 updates."""
    cfg = solo_config(train=dict(train, max_steps=4, save_steps=1000), grpo=grpo)
    trainer_in_process(cfg, out, tiny_model, dataset).run()
    return out


def test_the_report_names_the_options_that_are_on_beside_the_recipe():
    from videogrpo.config import Config, to_dict
    from videogrpo.provenance.report_page import recipe_summary

    config = to_dict(Config())
    assert "options" not in recipe_summary(config, 3)
    config["grpo"].update(clip_range_high=0.28, skip_zero_variance_groups=True)
    assert recipe_summary(config, 3).endswith(
        "options grpo.clip_range_high = 0.28, grpo.skip_zero_variance_groups = true"
    )


def test_the_advantage_std_of_each_author():
    """Each rollout's advantage is (r - its group's mean) / (std + eps), clamped to +-5; the std as each author's
    stat tracker takes it, written here in numpy as they do: the reference's and MixGRPO's per group with n - 1,
    Flow-GRPO's and GRPO-Guard's per group and the population's, Flow-GRPO-Fast's and DiffusionNFT's one population
    std over the whole batch."""
    import numpy as np

    rewards = torch.tensor([[0.1, 0.9, 0.4, 0.4], [0.2, 0.2, 0.2, 0.2], [1.0, 0.0, 0.5, 0.25]])
    r = rewards.double().numpy()
    mean = r.mean(axis=1, keepdims=True)
    for over, unbiased, eps, std in (
        ("group", True, 1e-4, r.std(axis=1, ddof=1, keepdims=True)),
        ("group", True, 1e-8, r.std(axis=1, ddof=1, keepdims=True)),
        ("group", False, 1e-4, r.std(axis=1, keepdims=True)),
        ("batch", False, 1e-4, np.std(r)),
        ("batch", True, 1e-4, np.std(r, ddof=1)),
    ):
        want = np.clip((r - mean) / (std + eps), -5, 5)
        got = group_advantages(rewards, over, unbiased, eps)
        assert np.allclose(got.numpy(), want, rtol=1e-6, atol=0), (over, unbiased, eps)
    assert torch.equal(group_advantages(rewards), group_advantages(rewards, "group", True, 1e-4))  # the reference
    # The batch std lets a group without signal keep zeros and scales every group alike: the groups' ratio survives.
    batch = group_advantages(rewards, "batch", False)
    assert not batch[1].any() and float(batch[0, 1] / batch[2, 0]) == pytest.approx(0.45 / 0.5625, rel=1e-6)


def test_the_kept_rollouts_are_those_with_an_advantage_refilled_to_a_multiple_of_the_updates():
    grpo = {"prompts_per_step": 3, "group_size": 4, "updates_per_batch": 2}
    g = config.from_dict(trainer_config(grpo=grpo, parallel={"procs_per_node": 1})).grpo
    adv = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    kept = minibatches.kept_rows(g, 42, 5, adv)
    assert {r for r in kept if adv[r] != 0} == {(1, 0), (1, 1), (1, 3)} and len(kept) == 4  # 3 + one put back
    assert kept == minibatches.kept_rows(g, 42, 5, adv)  # keyed by the batch: the same on every rank
    assert len(minibatches.kept_rows(g, 42, 5, torch.zeros(3, 4))) == 2  # none: as many as updates, refilled
    sets = minibatches.update_sets(g, 42, 5, kept)
    assert [len(s) for _, s in sets] == [2, 2] and set().union(*(s for _, s in sets)) == set(kept)


def test_dropped_rollouts_leave_the_loss_and_are_not_replayed(tiny_model, dataset, tmp_path):
    """One group of two without signal: its four rollouts have advantage 0 and are dropped, so the first update's
    gradient is the kept group's alone, twice the reference's (as skip_zero_variance_groups'); every group flat,
    one rollout is put back and the update has no gradient."""
    kept = run(tmp_path / "kept", tiny_model, dataset)
    dropped = run(tmp_path / "dropped", tiny_model, dataset, drop_zero_advantage=True)
    assert "dropped_rollouts" not in kept[0] and [m["dropped_rollouts"] for m in dropped] == [4, 4]
    assert kept[0]["reward_mean"] == dropped[0]["reward_mean"]
    assert dropped[0]["grad_norm"] == pytest.approx(2 * kept[0]["grad_norm"], rel=1e-5)
    flat = run(tmp_path / "flat", tiny_model, dataset, flat=True, drop_zero_advantage=True)
    assert [m["dropped_rollouts"] for m in flat] == [7, 7] and [m["grad_norm"] for m in flat] == [0.0, 0.0]
