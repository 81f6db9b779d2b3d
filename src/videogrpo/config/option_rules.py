"""The cross-field rules of the options beyond the reference (docs/options.md): the SDE window, DiffusionNFT,
validation during training and gold rewards, the best point's export, LoRA. Each returns the rules a config breaks,
naming the field, the value and the fix; `checks.CHECKS` runs each where the sections it reads are present.

May import: `config.fields`, `config.cells`, `config.sections` and the core modules.
"""

from __future__ import annotations

import math

from videogrpo.config.cells import sampler_problem
from videogrpo.config.fields import CHOICES, training_reward_kinds
from videogrpo.config.sections import Config, GRPOConfig


def sde_window_problems(g) -> list[str]:
    """The SDE window (docs/options.md#sde-window): a size that fits its range, a range inside the denoising steps."""
    size = g.sde_window_size
    if size < 0:
        return [f"grpo.sde_window_size = {size}: must be >= 0 (0: off, SDE on every step)"]
    if not size:
        if g.sde_window_tail != "euler":
            return [
                f"grpo.sde_window_tail = {g.sde_window_tail!r} with grpo.sde_window_size = 0: the tail is what follows "
                "an SDE window; set a window size, or the tail back to 'euler'"
            ]
        return []
    if g.sde_window_range is None:
        lo, hi = 0, g.sampling_steps
    elif len(g.sde_window_range) != 2 or not 0 <= g.sde_window_range[0] < g.sde_window_range[1] <= g.sampling_steps:
        return [
            f"grpo.sde_window_range = {g.sde_window_range}: must be [lo, hi] with 0 <= lo < hi <= "
            f"grpo.sampling_steps ({g.sampling_steps}), or null (every step)"
        ]
    else:
        lo, hi = g.sde_window_range
    if size > hi - lo:
        return [f"grpo.sde_window_size = {size}: larger than its range [{lo}, {hi}) (grpo.sde_window_range)"]
    if not 0 < g.sde_window_tail_ratio <= 1:
        return [
            f"grpo.sde_window_tail_ratio = {g.sde_window_tail_ratio}: must be in (0, 1] (the share of the steps after "
            "the window the DPM-Solver tail keeps)"
        ]
    return []


def update_problems(g) -> list[str]:
    """Several updates per batch (docs/options.md#several-updates-per-batch): sets of equal size; the
    zero-advantage filter beside one, not both, of the ways to leave rollouts without signal out."""
    u = g.updates_per_batch
    if g.drop_zero_advantage and g.skip_zero_variance_groups:
        return [
            "grpo.drop_zero_advantage and grpo.skip_zero_variance_groups are both true: a group without signal has "
            "only zero advantages, which the first drops already; turn one off"
        ]
    if g.drop_zero_advantage and u > 1 and g.update_order == "by_member":
        return [
            "grpo.drop_zero_advantage with grpo.update_order = 'by_member': the kept rollouts do not split into "
            "equal member blocks; use update_order 'shuffled' (as the authors who drop them)"
        ]
    if u <= 1 or g.group_size <= 0 or g.prompts_per_step <= 0:  # field_problems names a count that is not > 0
        return []
    if g.update_order == "by_member" and g.group_size % u:
        return [
            f"grpo.updates_per_batch = {u} with grpo.update_order = 'by_member': must divide grpo.group_size "
            f"({g.group_size}), each update taking as many members of every prompt"
        ]
    rows = g.prompts_per_step * g.group_size
    if g.update_order == "shuffled" and rows % u:
        return [
            f"grpo.updates_per_batch = {u}: must divide the batch's {rows} rollouts (grpo.prompts_per_step x "
            "grpo.group_size), each update taking as many"
        ]
    return []


DETERMINISTIC_SAMPLERS = ("euler", "dpm_solver")
"""grpo.sampler values without noise, hence without a log-probability: DiffusionNFT's rollouts only."""


def nft_problems(g) -> list[str]:
    """DiffusionNFT (docs/options.md#diffusionnft) and the deterministic samplers only it can train with."""
    if g.algorithm != "nft":
        if g.sampler in DETERMINISTIC_SAMPLERS:
            return [
                f"grpo.sampler = {g.sampler!r}: the deterministic ODE has no log-probability for GRPO to train; it "
                "samples for grpo.algorithm = 'nft' only (or use flowcps, dancegrpo, flowgrpo, flowgrpo_sde)"
            ]
        return []
    found = []
    why = "DiffusionNFT trains the noising process, with no log-probability or ratio"
    for field, on, what in (
        ("grpo_guard", g.grpo_guard, "normalises GRPO's ratio"),
        ("sde_window_size", g.sde_window_size, "picks the steps GRPO replays"),
        ("clip_range_high", g.clip_range_high, "clips GRPO's ratio"),
        ("skip_zero_variance_groups", g.skip_zero_variance_groups, "relies on GRPO's zero advantage meaning no loss"),
        ("drop_zero_advantage", g.drop_zero_advantage, "relies on GRPO's zero advantage meaning no loss"),
    ):
        if on:
            found.append(f"grpo.{field} = {on!r} with grpo.algorithm = 'nft': it {what}; {why}. Turn it off")
    if g.delayed_replay:
        found.append(
            "grpo.delayed_replay = true with grpo.algorithm = 'nft': DiffusionNFT reflects the trained policy through "
            "the old policy that sampled the batch, and a delayed batch was sampled by an older one; set "
            "grpo.delayed_replay: false"
        )
    if g.sampler in DETERMINISTIC_SAMPLERS and g.share_group_noise:
        found.append(
            f"grpo.sampler = {g.sampler!r} with grpo.share_group_noise = true: the ODE from one initial noise makes "
            "every member of a group the same video (no advantage); set grpo.share_group_noise: false"
        )
    if not 0 <= g.nft_old_decay_max < 1:
        found.append(f"grpo.nft_old_decay_max = {g.nft_old_decay_max}: must be in [0, 1) (1 would never update it)")
    return found


def validation_problems(cfg: Config) -> list[str]:
    """Validation during training (train.validate_*) samples held-out prompts with a matrix sampler."""
    t = cfg.train
    found = []
    if t.validate_every < 0:
        found.append(f"train.validate_every = {t.validate_every}: must be >= 0 (0: no validation during training)")
    if t.validate_prompts <= 0:
        found.append(
            f"train.validate_prompts = {t.validate_prompts}: must be > 0 (to turn validation off, set "
            f"train.validate_every: 0 and train.validate_before_training: false)"
        )
    if why := sampler_problem(t.validate_sampler):
        found.append(f"train.validate_sampler: {why}")
    on = t.validate_every > 0 or t.validate_before_training
    if on and cfg.data.heldout_per_task == 0:
        found.append(
            f"train.validate_every = {t.validate_every}, train.validate_before_training = "
            f"{t.validate_before_training}: validation samples held-out prompts, but data.heldout_per_task is 0; "
            f"hold samples out with data.heldout_per_task >= 1 (which removes them from training), or turn validation "
            f"off (train.validate_every: 0, train.validate_before_training: false)"
        )
    return found


def gold_problems(cfg: Config) -> list[str]:
    """Gold rewards (train.validate_rewards) score validation points with rewards the policy is not trained on."""
    t, known = cfg.train, CHOICES["reward.kind"]
    if t.keep_best_by is not None and t.keep_best_by not in t.validate_rewards:
        return [
            f"train.keep_best_by = {t.keep_best_by!r}: not among train.validate_rewards ({t.validate_rewards}); the "
            "best point is chosen by a gold reward's score: list it there, or unset keep_best_by"
        ]
    if t.stop_on_divergence and not t.validate_rewards:
        return [
            "train.stop_on_divergence = true with train.validate_rewards empty: the divergence alarm watches gold "
            "rewards; list one (train.validate_rewards), or set stop_on_divergence false"
        ]
    if not t.validate_rewards:
        return []
    validating = t.validate_every > 0 or t.validate_before_training
    found = [
        f"train.validate_rewards: unknown reward kind {kind!r}; the kinds are {', '.join(known)}"
        for kind in t.validate_rewards
        if kind not in known
    ]
    if len(set(t.validate_rewards)) != len(t.validate_rewards):
        found.append(f"train.validate_rewards = {t.validate_rewards}: a reward is listed twice")
    if not validating:
        found.append(
            f"train.validate_rewards = {t.validate_rewards}: gold rewards score the validation points, and this run "
            f"validates never; set train.validate_every (and/or train.validate_before_training: true)"
        )
    if t.stop_on_divergence and t.save_steps <= 0:
        found.append(
            "train.stop_on_divergence = true with train.save_steps = 0: the run stops at the checkpoint after the "
            "alarm, and this one writes none before its end; set train.save_steps"
        )
    for field in ("divergence_sigmas", "divergence_min_change"):
        if not math.isfinite(value := getattr(t, field)) or value < 0:
            found.append(f"train.{field} = {value}: must be a finite number >= 0")
    if t.validate_prompts < 2:
        found.append(
            f"train.validate_prompts = {t.validate_prompts} with gold rewards: the divergence alarm takes the standard "
            f"error of a change over the prompts, which needs 2 or more"
        )
    return found


def run_model_problems(cfg: Config) -> list[str]:
    """The matrix's `best` and `ema` models are exports that train.keep_best_by and train.ema_decay make."""
    found = []
    if "best" in cfg.matrix.models and not cfg.train.keep_best_by:
        found.append(
            "matrix.models lists 'best', the weights of the best validation point, which only a run with "
            "train.keep_best_by exports; set train.keep_best_by (with train.validate_rewards), or drop 'best'"
        )
    if "ema" in cfg.matrix.models and cfg.train.ema_decay is None:
        found.append(
            "matrix.models lists 'ema', the moving average of the trained weights, which only a run with "
            "train.ema_decay exports; set train.ema_decay (0.9 as Flow-GRPO and DiffusionNFT), or drop 'ema'"
        )
    return found


def ema_problems(cfg: Config) -> list[str]:
    """train.ema_*: a decay in (0, 1), counts of at least 1."""
    t, found = cfg.train, []
    if t.ema_decay is not None and not 0 < t.ema_decay < 1:
        found.append(f"train.ema_decay = {t.ema_decay}: must be in (0, 1), or null for no moving average")
    for name in ("ema_every", "ema_repeats"):
        if getattr(t, name) < 1:
            found.append(f"train.{name} = {getattr(t, name)}: must be 1 or more")
    return found


def gold_overlap_problems(cfg: Config) -> list[str]:
    """A gold reward is none of the rewards the policy trains on."""
    t = cfg.train
    if trained := sorted(set(t.validate_rewards) & set(training_reward_kinds(cfg))):
        return [
            f"train.validate_rewards = {t.validate_rewards}: {', '.join(trained)} is a training reward (reward.kind "
            f"or reward.terms), so the policy is trained on it and it cannot show the training reward being gamed; "
            f"list rewards the run does not train on"
        ]
    return []


def lora_problems(cfg: Config) -> list[str]:
    """LoRA (docs/options.md#lora): its settings, and the layouts it trains under."""
    t = cfg.train
    if t.lora_rank <= 0:
        return []
    found = []
    if t.lora_alpha is not None and t.lora_alpha <= 0:
        found.append(f"train.lora_alpha = {t.lora_alpha!r}: must be > 0, or null (lora_rank)")
    if t.lora_dropout >= 1:
        found.append(f"train.lora_dropout = {t.lora_dropout!r}: must be below 1 (the share of inputs dropped)")
    if not t.lora_targets or not all(isinstance(n, str) and n.strip() for n in t.lora_targets):
        found.append(
            f"train.lora_targets = {t.lora_targets!r}: must name at least one linear layer of the transformer "
            f"(suffixes of module names, e.g. to_q, ffn.net.2)"
        )
    if t.resume_from and t.reset_dataloader:
        # The weights-only loader maps a checkpoint's transformer keys onto the model's; peft renames the wrapped
        # layers' (base_layer), so it would find none of them.
        found.append(
            f"train.resume_from = {t.resume_from!r} with train.reset_dataloader: true and train.lora_rank = "
            f"{t.lora_rank}: starting adapters from another run's weights is not supported; start the LoRA run from "
            f"the base model (remove train.resume_from), or resume its own checkpoint (train.reset_dataloader: false)"
        )
    if cfg.parallel.tensor_parallel > 1:
        # The TP plan replaces the very projections peft wraps (attention and FFN) by sharded ones, whose weights
        # the adapters' merge and export would need whole.
        found.append(
            f"train.lora_rank = {t.lora_rank} with parallel.tensor_parallel = {cfg.parallel.tensor_parallel}: LoRA "
            f"is not supported under tensor parallelism (its plan shards the attention and FFN projections the "
            f"adapters wrap); set parallel.tensor_parallel: 1 (FSDP or HSDP shard the frozen base as well)"
        )
    return found


def setting_warnings(cfg: Config, optimizer_updates: int | None = None) -> list[str]:
    """Settings that run, but leave an algorithm a shadow of itself (docs/options.md#settings-that-neuter-an-
    algorithm): each warning names the fields, what the combination does and what its authors set.
    `optimizer_updates`: the run's length where it is known (the trainer); else train.max_steps gives it, if set."""
    g, found = cfg.grpo, []
    updates = g.updates_per_batch * g.update_passes
    if g.algorithm == "grpo" and g.grpo_guard and not g.delayed_replay and updates == 1:
        found.append(
            "grpo.grpo_guard = true with one update per batch (grpo.updates_per_batch 1, grpo.update_passes 1) and no "
            "delayed replay: every update is on-policy, the ratio is exactly 1 and the clip never acts, so GRPO-Guard "
            "only reweights the gradient by 1 / (sigma - sigma'); its authors take 2 updates a batch "
            "(config/algorithms/grpo_guard.yaml)"
        )
    lo, hi = g.sde_window_range or (0, g.sampling_steps)
    starts_late = lo > 0 or (g.sde_window_mode == "random" and hi - lo > g.sde_window_size)
    if g.sde_window_size and g.sde_window_mode == "random" and g.share_group_noise and starts_late:
        found.append(
            f"grpo.sde_window_size = {g.sde_window_size} (random) with grpo.share_group_noise = true: a group's "
            "members start from one noise and follow one Euler path up to the window, so they differ only by its "
            "few SDE steps; Flow-GRPO-Fast draws each member's own noise (grpo.share_group_noise: false, "
            "config/algorithms/flow_grpo_fast.yaml)"
        )
    if g.sde_window_size and g.timestep_fraction != GRPOConfig.timestep_fraction:  # set, so meant to act
        found.append(
            f"grpo.timestep_fraction = {g.timestep_fraction} is not used: with an SDE window (grpo.sde_window_size "
            f"{g.sde_window_size}) the window's steps are the trained ones"
        )
    if g.algorithm == "nft" and g.kl_coeff == 0:
        found.append(
            "grpo.algorithm = 'nft' with grpo.kl_coeff = 0: DiffusionNFT's authors always add a KL of 1e-4 to the "
            "base model's velocity (grpo.kl_coeff: 0.0001)"
        )
    if g.advantage_std == "batch" and g.prompts_per_step == 1:
        found.append(
            "grpo.advantage_std = 'batch' with one prompt a step (grpo.prompts_per_step 1): the batch is the group, "
            "so it changes nothing"
        )
    t = cfg.train
    known = optimizer_updates is not None
    count = optimizer_updates if known else (t.max_steps * updates if t.max_steps else None)
    # The moving average first blends after update ema_every - 1 (grpo/weight_copy.py, ema_blends).
    if t.ema_decay is not None and count is not None and count < t.ema_every - 1:
        found.append(
            f"train.ema_every = {t.ema_every} with {count} optimizer updates: the moving average never blends, so "
            "ema/ will hold the initial weights"
            if known
            else f"train.ema_every = {t.ema_every} with {count} optimizer updates (train.max_steps {t.max_steps} x "
            f"{updates} a batch): the moving average first blends after update {t.ema_every - 1}, so ema/ would hold "
            "the initial weights; lower train.ema_every or train longer"
        )
    return found
