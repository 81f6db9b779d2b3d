"""tools/algo_diff's project side on stored inputs, against the algorithms' authors' own code's stored outputs.

tests/data/algo_diff/flow_grpo_steps.pt holds a 10-step schedule, per step a latent, a velocity and a next latent,
and what Flow-GRPO's `sde_step_with_logprob` (yifan123/flow_grpo, run by tools/algo_diff/flow_grpo_steps.py from a
checkout) computed from them. This project's Flow-CPS transition, its log-probability, the Euler step outside an
SDE window and the flowgrpo_sde transition (their `sde` type) with its log-probability must agree to float
round-off.
"""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "tools/algo_diff"))

import flow_grpo_steps  # noqa: E402


def failing_with(monkeypatch, tool, stored: dict, section: str, name: str, value) -> set[str]:
    """The outputs of a whole-step tool whose comparison with the stored authors' outputs fails once the tool's preset
    has `section.name` set to `value` (a tool of several presets: the setting in each). The test's earlier patches are
    undone first, so that each call changes one setting."""
    monkeypatch.undo()
    real = tool.preset_config

    def config(*preset):
        cfg = real(*preset)
        setattr(getattr(cfg, section), name, value)
        return cfg

    monkeypatch.setattr(tool, "preset_config", config)
    return {n for n, _, ok in tool.compare(stored["theirs"], tool.project_side(stored["inputs"])) if not ok}


def test_the_flowcps_sde_and_ode_steps_are_flow_grpos_to_round_off():
    stored = torch.load(REPO / "tests/data/algo_diff/flow_grpo_steps.pt", weights_only=True)
    assert stored["commit"] == "9745241cf1101407e9b518dd4f10498092150522"
    ours = flow_grpo_steps.project_side(stored["inputs"])
    rows = flow_grpo_steps.compare(stored["theirs"], ours)
    assert [name for name, *_ in rows] == [
        "cps_mean",
        "cps_std",
        "cps_log_prob",
        "ode_mean",
        "sde_mean",
        "sde_log_prob",
    ]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: a mean off by 0.1 % is caught.
    other = {**ours, "cps_mean": ours["cps_mean"] * 1.001}
    assert not dict((n, ok) for n, _, ok in flow_grpo_steps.compare(stored["theirs"], other))["cps_mean"]


def test_diffusion_nft_objective_update_and_old_policy_are_the_authors_to_round_off():
    """tests/data/algo_diff/diffusion_nft.pt: DiffusionNFT's own loss lines, return_decay and old-policy mix
    (NVlabs/DiffusionNFT scripts/train_nft_sd3.py, run by tools/algo_diff/diffusion_nft.py) on stored inputs."""
    import diffusion_nft

    stored = torch.load(REPO / "tests/data/algo_diff/diffusion_nft.pt", weights_only=True)
    assert stored["commit"] == "24af5554898d85e93efa492f42b5e9cdf4156e9b"
    ours = diffusion_nft.project_side(stored["inputs"])
    rows = diffusion_nft.compare(stored["theirs"], ours)
    assert [name for name, *_ in rows] == ["loss", "grad", "updated", "decay", "mixed"]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: r taken unclipped (two advantages lie beyond the clip) moves the loss and its gradient.
    from videogrpo.grpo import nft

    real = nft.optimality
    try:
        nft.optimality = lambda a, c: a.float() / c / 2 + 0.5
        broken = diffusion_nft.project_side(stored["inputs"])
    finally:
        nft.optimality = real
    verdict = dict((n, ok) for n, _, ok in diffusion_nft.compare(stored["theirs"], broken))
    assert not verdict["loss"] and not verdict["grad"]


@pytest.mark.parametrize("scope", ["micro_batch", "row", "off"])
def test_grpo_guards_and_the_plain_ratio_loss_and_update_are_flow_grpos_to_round_off(scope):
    """tests/data/algo_diff/grpo_guard.pt: Flow-GRPO's own ratio and loss lines (run by tools/algo_diff/grpo_guard.py)
    on their SDE step's tensors at four noise levels: GRPO-Guard's (scripts/train_sd3_GRPO_Guard.py) on a micro-batch
    of four rows (the scope micro_batch, their code's) and of one row (the scope row, their paper's), and the plain
    PPO loss of Flow-GRPO-Fast's script (scripts/train_sd3_fast.py: GRPO-Guard off)."""
    import grpo_guard

    stored = torch.load(REPO / "tests/data/algo_diff/grpo_guard.pt", weights_only=True)
    assert stored["commit"] == "9745241cf1101407e9b518dd4f10498092150522"
    stepped = grpo_guard.with_mean(stored["stepped"])
    rows = grpo_guard.compare(stored["theirs"][scope], grpo_guard.project_side(stored["inputs"], stepped, scope))
    assert [name for name, *_ in rows] == ["ratio", "loss", "grad", "updated"]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: another scope's terms are caught.
    other = grpo_guard.project_side(stored["inputs"], stepped, "row" if scope != "row" else "micro_batch")
    assert not dict((n, ok) for n, _, ok in grpo_guard.compare(stored["theirs"][scope], other))["grad"]
    if scope == "off":
        return
    from videogrpo.grpo import loss

    real = loss.guard_log_ratio  # and the normalised ratio without its mean-shift term
    try:
        loss.guard_log_ratio = lambda lp, old, m, om, std, mask=None, per_row=True: (lp - old.detach()) * std
        broken = grpo_guard.project_side(stored["inputs"], stepped, scope)
    finally:
        loss.guard_log_ratio = real
    verdict = dict((n, ok) for n, _, ok in grpo_guard.compare(stored["theirs"][scope], broken))
    assert not verdict["ratio"] and not verdict["loss"]


def test_the_sliding_window_is_mixgrpos_schedule_end_of_sweep_included():
    """tests/data/algo_diff/mixgrpo_window.pt: the steps MixGRPO's GRPOTrainingStates (their MixGRPO script's
    settings, run by tools/algo_diff/mixgrpo_window.py) trains at each of 700 iterations, windows cut at the end of
    the range and empty ones among them; the sliding window's per batch must be the same."""
    import mixgrpo_window

    stored = torch.load(REPO / "tests/data/algo_diff/mixgrpo_window.pt", weights_only=True)
    assert stored["commit"] == "e5cdd6a427778d8c8b2e7a48ce16972141adbe7c"
    theirs = stored["theirs"]
    assert sum(not w for w in theirs) == 25 and len(theirs) == mixgrpo_window.ITERATIONS
    assert mixgrpo_window.compare(theirs, mixgrpo_window.our_windows()) == []
    # The comparison can fail: restarting once a whole window would leave the range (no cut windows) is caught.
    restarted = [w if len(w) == mixgrpo_window.SIZE else list(range(4)) for w in mixgrpo_window.our_windows()]
    assert mixgrpo_window.compare(theirs, restarted)


def test_the_dpm_solver_tail_is_mixgrpo_flashs_to_round_off():
    """tests/data/algo_diff/mixgrpo_tail.pt: MixGRPO-Flash's sampling loop (their `run_sample_step`, `post`
    DPM-Solver++ 2M, run by tools/algo_diff/mixgrpo_tail.py) over a stand-in transformer, for every window of their
    sweep at Flash's and Flash*'s ratios: the noise levels and the final latent of this project's rollout with the
    dpm_solver tail must agree to round-off, the tails of one noise level (ending above 0) included."""
    import mixgrpo_tail

    stored = torch.load(REPO / "tests/data/algo_diff/mixgrpo_tail.pt", weights_only=True)
    assert stored["commit"] == "e5cdd6a427778d8c8b2e7a48ce16972141adbe7c"
    theirs = stored["theirs"]
    assert len(theirs) == 2 * len(mixgrpo_tail.windows()) == 46
    # A tail of one noise level ends the sample above 0: windows ending at 22 or later (Flash), 17 or later (Flash*).
    assert sum(float(case["sigmas"][-1]) > 0 for case in theirs.values()) == 5 + 10
    rows = mixgrpo_tail.compare(theirs, mixgrpo_tail.our_samples(stored["inputs"]))
    assert len(rows) == 92 and all(ok for *_, ok in rows), [r for r in rows if not r[2]]
    # The comparison can fail: a first-order tail (no history), or the Euler tail on every remaining step.
    from videogrpo.grpo import samplers, sde_window

    real_step, real_tail = samplers.dpm_solver_step, sde_window.tail
    try:
        samplers.dpm_solver_step = lambda x, x0, s, s_next, before, dtype: real_step(x, x0, s, s_next, None, dtype)
        first_order = mixgrpo_tail.compare(theirs, mixgrpo_tail.our_samples(stored["inputs"]))
        samplers.dpm_solver_step = real_step
        sde_window.tail = lambda g, shift, steps: None
        euler = mixgrpo_tail.compare(theirs, mixgrpo_tail.our_samples(stored["inputs"]))
    finally:
        samplers.dpm_solver_step, sde_window.tail = real_step, real_tail
    assert sum(not ok for *_, ok in first_order) >= 20
    assert sum(not ok for *_, ok in euler) >= 30


def test_the_dpm_solver_rollouts_are_diffusion_nfts_to_round_off():
    """tests/data/algo_diff/nft_rollout.pt: DiffusionNFT's sampling loop (their `run_sampling` with the deterministic
    `dpm2` solver, run by tools/algo_diff/nft_rollout.py) over a stand-in transformer, for a 10- and a 6-step
    schedule: every state of this project's rollout with sampler dpm_solver must agree to round-off."""
    import nft_rollout

    stored = torch.load(REPO / "tests/data/algo_diff/nft_rollout.pt", weights_only=True)
    assert stored["commit"] == "24af5554898d85e93efa492f42b5e9cdf4156e9b"
    ours = nft_rollout.project_side(stored["inputs"])
    assert {name: tuple(t.shape[:2]) for name, t in ours.items()} == {"steps10": (2, 11), "steps6": (2, 7)}
    rows = nft_rollout.compare(stored["theirs"], ours)
    assert [name for name, *_ in rows] == ["steps10", "steps6"] and all(ok for *_, ok in rows), rows
    # The comparison can fail: the first-order solver on every step (no history), or the last step not landing on
    # the clean prediction.
    from videogrpo.grpo import samplers

    real_step = samplers.dpm_solver_step
    try:
        samplers.dpm_solver_step = lambda x, x0, s, s_next, before, dtype: real_step(x, x0, s, s_next, None, dtype)
        first_order = nft_rollout.compare(stored["theirs"], nft_rollout.project_side(stored["inputs"]))
        samplers.dpm_solver_step = lambda x, x0, s, s_next, before, dtype: real_step(
            x, x0, s, max(s_next, 1e-3), before, dtype
        )
        short = nft_rollout.compare(stored["theirs"], nft_rollout.project_side(stored["inputs"]))
    finally:
        samplers.dpm_solver_step = real_step
    assert not any(ok for *_, ok in first_order) and not any(ok for *_, ok in short)


def test_the_moving_average_is_flow_grpos_and_diffusion_nfts_to_round_off():
    """tests/data/algo_diff/weight_ema.pt: Flow-GRPO's EMAModuleWrapper (flow_grpo/ema.py, also DiffusionNFT's),
    called as Flow-GRPO-Fast's, GRPO-Guard's and DiffusionNFT's loops call it, over 40 updates (run by
    tools/algo_diff/weight_ema.py): this project's average with their train.ema_* values must agree after every
    update."""
    import weight_ema

    stored = torch.load(REPO / "tests/data/algo_diff/weight_ema.pt", weights_only=True)
    assert stored["commit"] == "9745241cf1101407e9b518dd4f10498092150522"
    rows = weight_ema.compare(stored["theirs"], weight_ema.project_side(stored["inputs"]))
    assert sorted(name for name, *_ in rows) == sorted(weight_ema.LOOPS) and all(ok for *_, ok in rows), rows
    # The comparison can fail: one blend where GRPO-Guard's loop makes four, or every blend after the update.
    from videogrpo.grpo import weight_copy

    real_loops, real_step = dict(weight_ema.LOOPS), weight_copy.step_ema
    try:
        weight_ema.LOOPS["grpo_guard"] = (0.9, 8, 1)
        once = dict(
            (n, ok) for n, _, ok in weight_ema.compare(stored["theirs"], weight_ema.project_side(stored["inputs"]))
        )
        weight_ema.LOOPS.update(real_loops)
        weight_copy.step_ema = lambda ema, update, t, after: real_step(ema, update, t, True) if after else None
        late = weight_ema.compare(stored["theirs"], weight_ema.project_side(stored["inputs"]))
    finally:
        weight_ema.LOOPS.update(real_loops)
        weight_copy.step_ema = real_step
    assert once == {"flow_grpo_fast": True, "grpo_guard": False, "diffusion_nft": True}
    assert [ok for *_, ok in late] == [False, False, True]  # DiffusionNFT blends once, after its update


def test_the_presets_advantages_are_the_authors_stat_trackers_to_round_off():
    """tests/data/algo_diff/advantages.pt: Flow-GRPO's PerPromptStatTracker (flow_grpo/stat_tracking.py, also
    DiffusionNFT's; run by tools/algo_diff/advantages.py) with one std over the batch (Flow-GRPO-Fast, DiffusionNFT)
    and per prompt (GRPO-Guard): this project's group advantages with the presets' settings must agree."""
    import advantages

    stored = torch.load(REPO / "tests/data/algo_diff/advantages.pt", weights_only=True)
    assert stored["commit"] == "9745241cf1101407e9b518dd4f10498092150522"
    rows = advantages.compare(stored["theirs"], advantages.project_side(stored["inputs"]))
    assert [name for name, *_ in rows] == ["batch_std", "group_std"] and all(ok for *_, ok in rows), rows
    # The comparison can fail: the reference's unbiased std is not theirs.
    from videogrpo.grpo import advantages as ours

    real = ours.group_advantages
    try:
        ours.group_advantages = lambda r, over, unbiased, eps: real(r, over, True, eps)
        unbiased = advantages.compare(stored["theirs"], advantages.project_side(stored["inputs"]))
    finally:
        ours.group_advantages = real
    assert not any(ok for *_, ok in unbiased)


def test_one_whole_diffusion_nft_step_is_its_authors_loop_to_round_off(monkeypatch):
    """tests/data/algo_diff/nft_step.pt: one step of config/algorithms/diffusion_nft.yaml over a stand-in transformer,
    their sampling, stat tracker, training loop lines (train_nft_sd3.py), EMA and old-policy update (run by
    tools/algo_diff/nft_step.py with this project's draws handed in): the trainer's own prepare and update (the
    rollouts with the old policy, the advantages, the replay, the optimizer step, the EMA and the old policy's mix)
    must agree, the gradient included."""
    import nft_step

    stored = torch.load(REPO / "tests/data/algo_diff/nft_step.pt", weights_only=True)
    assert stored["commit"] == "24af5554898d85e93efa492f42b5e9cdf4156e9b"
    rows = nft_step.compare(stored["theirs"], nft_step.project_side(stored["inputs"]))
    assert [name for name, *_ in rows] == ["states", "advantages", "gradient", "trained", "ema", "old"]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: the preset's KL term left out moves the gradient; an old policy that never decays
    # moves the old weights.
    assert "gradient" in failing_with(monkeypatch, nft_step, stored, "grpo", "kl_coeff", 0.0)
    monkeypatch.undo()
    from videogrpo.grpo import nft

    monkeypatch.setattr(nft, "old_decay", lambda *args: 0.0)
    assert "old" in {
        n for n, _, ok in nft_step.compare(stored["theirs"], nft_step.project_side(stored["inputs"])) if not ok
    }


def test_one_whole_flow_grpo_fast_step_is_its_authors_epoch_to_round_off(monkeypatch):
    """tests/data/algo_diff/fast_step.pt: one step of config/algorithms/flow_grpo_fast.yaml over a stand-in transformer,
    their epoch's lines of train_sd3_fast.py (their windowed sampling pipeline, stat tracker, zero-advantage mask, 4
    mini-batches under accelerate's gradient accumulation, the EMA after each; run by tools/algo_diff/fast_step.py
    with this project's draws handed in): the trainer's own prepare and update must agree, each update's gradient
    included."""
    import fast_step

    stored = torch.load(REPO / "tests/data/algo_diff/fast_step.pt", weights_only=True)
    assert stored["commit"] == "9745241cf1101407e9b518dd4f10498092150522"
    rows = fast_step.compare(stored["theirs"], fast_step.project_side(stored["inputs"]))
    assert [name for name, *_ in rows] == ["states", "log_probs", "advantages", "kept", "gradients", "trained", "ema"]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: the group's std in place of the batch's moves the advantages, and one EMA blend an
    # update in place of one a micro-batch moves the average.
    assert "advantages" in failing_with(monkeypatch, fast_step, stored, "grpo", "advantage_std", "group")
    assert "ema" in failing_with(monkeypatch, fast_step, stored, "train", "ema_repeats", 1)


def test_one_whole_grpo_guard_step_is_its_authors_epoch_to_round_off(monkeypatch):
    """tests/data/algo_diff/guard_step.pt: one step of config/algorithms/grpo_guard.yaml over a stand-in transformer,
    their epoch's lines of train_sd3_GRPO_Guard.py (their SDE pipeline with the means kept, per-group stat tracker,
    zero-advantage mask, shuffle, normalised ratio and dt-scaled loss over 4 micro-batches under accelerate's gradient
    accumulation, the EMA after each; run by tools/algo_diff/guard_step.py with this project's draws handed in): the
    trainer's own prepare and update must agree, each update's gradient included."""
    import guard_step

    stored = torch.load(REPO / "tests/data/algo_diff/guard_step.pt", weights_only=True)
    assert stored["commit"] == "9745241cf1101407e9b518dd4f10498092150522"
    rows = guard_step.compare(stored["theirs"], guard_step.project_side(stored["inputs"]))
    assert [name for name, *_ in rows] == [
        "states",
        "log_probs",
        "means",
        "advantages",
        "kept",
        "gradients",
        "trained",
        "ema",
    ]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: the mean-shift term per row (the paper's scope, not their code's), a clip that never
    # acts in the off-policy second update, and their 16-GPU count of EMA blends at this shape each move an output.
    assert "gradients" in failing_with(monkeypatch, guard_step, stored, "grpo", "grpo_guard_scope", "row")
    assert "gradients" in failing_with(monkeypatch, guard_step, stored, "grpo", "clip_range", 1.0)
    assert "ema" in failing_with(monkeypatch, guard_step, stored, "train", "ema_repeats", 4)


def test_one_whole_mixgrpo_and_flash_step_is_their_train_one_step_to_round_off(monkeypatch):
    """tests/data/algo_diff/mixgrpo_step.pt: one step of config/algorithms/mixgrpo.yaml and of mixgrpo_flash.yaml over
    a stand-in transformer, their train_one_step (train_grpo_flux.py: their sampling with the sliding window and, for
    Flash, the DPM-Solver tail, their group advantages, per-sample losses under gradient accumulation 3, 4 optimizer
    steps; run by tools/algo_diff/mixgrpo_step.py with this project's draws handed in): the trainer's own prepare and
    update must agree, each update's gradient included."""
    import mixgrpo_step

    stored = torch.load(REPO / "tests/data/algo_diff/mixgrpo_step.pt", weights_only=True)
    assert stored["commit"] == "e5cdd6a427778d8c8b2e7a48ce16972141adbe7c"
    rows = mixgrpo_step.compare(stored["theirs"], mixgrpo_step.project_side(stored["inputs"]))
    outputs = ["states", "log_probs", "advantages", "gradients", "trained"]
    assert [name for name, *_ in rows] == [f"{p}: {o}" for p in ("mixgrpo", "mixgrpo_flash") for o in outputs]
    assert all(ok for *_, ok in rows), rows
    # The comparison can fail: updates over shuffled rows in place of member blocks, the population std in place of
    # torch's n - 1, and the Euler tail in place of Flash's DPM-Solver each move an output.
    shuffled = failing_with(monkeypatch, mixgrpo_step, stored, "grpo", "update_order", "shuffled")
    population = failing_with(monkeypatch, mixgrpo_step, stored, "grpo", "advantage_std_unbiased", False)
    assert {"mixgrpo: gradients", "mixgrpo_flash: gradients"} <= shuffled
    assert {"mixgrpo: advantages", "mixgrpo_flash: advantages"} <= population
    assert failing_with(monkeypatch, mixgrpo_step, stored, "grpo", "sde_window_tail", "euler") == {
        "mixgrpo_flash: states"
    }


def test_the_refiners_loss_and_advantages_are_promptrls_and_unirls_to_round_off(monkeypatch):
    """tests/data/algo_diff/refiner_lm.pt: PromptRL's advantages, completion mask and LM loss (G-U-N/UniRL branch
    prompt_rl) on a tiny causal LM, with the gradient of every weight, and UniRL's clipped token loss in its three
    aggregations and its hierarchical advantages (Tencent-Hunyuan/UniRL), run by tools/algo_diff/refiner_lm.py:
    grpo/refiner_loss.py must agree. Each check can fail: PromptRL's loss without its KL, UniRL's clip at 1.0, or
    UniRL's advantages over the std plus 0.1, each breaks what it should."""
    import refiner_lm

    from videogrpo.grpo import refiner_loss

    stored = torch.load(REPO / "tests/data/algo_diff/refiner_lm.pt", weights_only=True)
    assert stored["commit"].startswith("PromptRL 53c28c9") and "UniRL 1a7b501" in stored["commit"]
    rows = refiner_lm.compare(stored["theirs"], refiner_lm.project_side(stored["inputs"]))
    assert len(rows) == 14 and all(ok for *_, ok in rows), rows

    def failing() -> set[str]:
        found = refiner_lm.compare(stored["theirs"], refiner_lm.project_side(stored["inputs"]))
        return {name for name, _, ok in found if not ok}

    real = refiner_loss.refiner_loss
    monkeypatch.setattr(refiner_loss, "refiner_loss", lambda *a, **k: real(*a, **dict(k, kl_weight=0.0)))
    assert {"cot_loss", "grad_head"} <= failing()
    monkeypatch.setattr(refiner_loss, "refiner_loss", lambda *a, **k: real(*a, **dict(k, clip_range=1.0)))
    assert {"loss token-mean", "grad seq-mean-token-mean"} <= failing()
    monkeypatch.setattr(refiner_loss, "refiner_loss", real)
    monkeypatch.setattr(
        refiner_loss,
        "population_advantages",
        lambda r, eps=1e-8: (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, unbiased=False, keepdim=True) + 0.1),
    )
    assert failing() == {"refiner advantages", "generator advantages"}
