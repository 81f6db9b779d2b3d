"""How far this project's trainer may be from the reference's in each compared quantity, per precision mode: the
one table behind every verdict of the tool (`compare`, `summary`, and the stored comparisons of `stored.py`).

Each entry is (absolute, relative): a difference passes when |project - reference| <= absolute + relative x the
quantity's magnitude, the magnitude being the reference's value (grad norm, KL, learning rate) or its largest
|element| (latents: of the batch; parameters: over all parameters; AdamW moments: over all moments); quantities
with relative 0 are bounded absolutely. Every bound is a few times the largest difference the full comparison
measured (README.md, "Measured", and the per-update tables of its run): what float round-off leaves, while a
change of the trainer's arithmetic moves the same quantity by far more (a std epsilon of 2e-4 instead of 1e-4 in
the group advantages moves the grad norm by 2.8e-4 relative, over 100 times its fp32 bound).

In bf16 mode both trainers round the same float32 trajectories to bf16, and now and then a value on a rounding
midpoint lands one bf16 ulp apart on the two sides (a "flip"). Until a flip occurs, bf16 mode agrees as closely as
fp32 mode and is held to the fp32 entries. The `bf16` entries hold what a flip reaches: the batch whose latents
flipped (its log-probabilities), every update that replays it, and everything after such an update (the policy
differs, so its next rollouts and updates do too); `reached` says which those are. Imports neither side's code.
"""

from __future__ import annotations

import math

TOLERANCE = {
    # Each comment: the largest difference measured, in the entry's units, and where (run, in the full comparison
    # of README.md, "Measured"; its earlier table at 58696aa counts too where it was larger), then the margin.
    "fp32": dict(
        # element |difference| of any rolled-out batch's latents: 1.2e-6 (delayed_dancegrpo); 4x
        latents=(5e-6, 0),
        # rolled-out log-probabilities: 3.6e-7 (delayed_dancegrpo at 58696aa); 5x
        log_probs=(2e-6, 0),
        # replayed log-probabilities: 2.4e-7 (most runs); the rolled-out ones' bound, the same computation
        new_log_probs=(2e-6, 0),
        # of the reference's grad norm: 3.3e-7 (multi_flowcps update 5, 5.6e-9 of 1.7e-2); 6x
        grad_norm=(0, 2e-6),
        # 2.0e-7 (world2_fsdp_delayed_flowcps); 5x. Absolute: the loss is near 0, its sign varies
        policy_loss=(1e-6, 0),
        # of the reference's KL: 3.5e-7 (a14b_flowcps_eta_range update 6, 1.9e-9 of 5.4e-3); 6x. The absolute
        # floor: KL is 0 on both sides while the policy is its own KL reference (the one-update runs)
        kl_loss=(1e-10, 2e-6),
        # the same formula on both sides, identical in every run; the relative bound allows for operation order
        learning_rate=(0, 1e-12),
        # 1.8e-7 (a14b_flowcps_eta_range); 5x. Absolute: advantages are normalised per group, their mean is near 0
        advantage_mean=(1e-6, 0),
        # PPO ratio mean and largest |ratio - 1|: 1.2e-7 (delayed_dancegrpo); 8x (a ratio is exp of a log-probability
        # difference, and those may differ by 2.4e-7)
        ppo=(1e-6, 0),
        # fraction of the ratios clipped: identical in every run
        ppo_clip_fraction=(1e-6, 0),
        # of the reference's largest parameter: 4.7e-7 (delayed_dancegrpo at 58696aa); 4x; ADAMW adds to it
        params=(0, 2e-6),
        # of the reference's largest first moment: 9.0e-7 (delayed_dancegrpo); 4x
        exp_avg=(0, 4e-6),
        # of the reference's largest second moment: 1.2e-6 (delayed_dancegrpo); 4x
        exp_avg_sq=(0, 5e-6),
    ),
    "bf16": dict(
        # of the batch's largest latent (a flip is one bf16 ulp, at most 2^-7 of the value, and later steps spread
        # it to smaller neighbours): 3.6e-3 (1.6e-2 of about 4.5: multi_flowcps at 58696aa, tp2_dancegrpo); 4x
        latents=(0, 2**-6),
        # the log-probability of a flipped transition: 7.1e-5 (world2_dancegrpo rank 1 at 58696aa); 4x
        log_probs=(3e-4, 0),
        # 7.1e-5 (world2_dancegrpo rank 1 and tp2_dancegrpo at 58696aa); 4x
        new_log_probs=(3e-4, 0),
        # of the reference's grad norm: 1.9e-4 (2.8e-5 of 0.146, world2_dancegrpo and tp2_dancegrpo at 58696aa,
        # update 3 after the 65 flips of batch 2); 5x
        grad_norm=(0, 1e-3),
        # 3.3e-7 (delayed_dancegrpo); 4.5x
        policy_loss=(1.5e-6, 0),
        # of the reference's KL: 2.8e-6 (8.1e-7 of about 0.29, world2_dancegrpo at 58696aa); 5x
        kl_loss=(1e-10, 1.5e-5),
        learning_rate=(0, 1e-12),
        # 1.8e-7 (a14b_flowcps_eta_range); 5x
        advantage_mean=(1e-6, 0),
        # 1.8e-7 (delayed_dancegrpo, the one run with flips whose side logs ratios); 5x
        ppo=(1e-6, 0),
        # identical in every run
        ppo_clip_fraction=(1e-6, 0),
        # of the reference's largest parameter: 2.2e-5 (tp2_a14b_flowcps_eta_range, update 2 moved a quarter of
        # its lr by the flips of batch 1); 4.5x
        params=(0, 1e-4),
        # of the reference's largest first moment: 3.3e-3 (world2_dancegrpo and tp2_dancegrpo at 58696aa); 4.5x
        exp_avg=(0, 1.5e-2),
        # of the reference's largest second moment: 8.4e-4 (delayed_dancegrpo); the first moment's bound
        exp_avg_sq=(0, 1.5e-2),
    ),
}

LATENT_FLIPS = {"fp32": 0.0, "bf16": 0.01}
"""Largest fraction of a rolled-out batch's latent elements that may differ by more than the fp32 bound of
`latents`: none in fp32 mode; in bf16 mode the flips, at most 65 of 23040 (0.28%, world2_dancegrpo rank 1,
batch 2, at 58696aa; 48 of 46080 in delayed_dancegrpo's batch 6 now): 3.5x. A difference of code rather than of
rounding moves most elements (the stored comparisons hold their sample of each batch to it too)."""

ADAMW = 1e-2
"""AdamW's step of a parameter is lr x m / (sqrt(v) + eps); for a gradient element near eps (1e-8) a round-off
difference in it moves the step by a visible fraction of the lr: an update differs by up to 2.8e-3 of its lr
(one_dancegrpo, fp32 mode; README.md, "AdamW amplification") while the gradients agree. The parameters' bound
adds this fraction (3.5x that) of every learning rate so far."""


def limit(mode: str, quantity: str, magnitude: float = 0.0, extra: float = 0.0) -> float:
    """The largest |project - reference| allowed for `quantity` in `mode` at this magnitude."""
    absolute, relative = TOLERANCE[mode][quantity]
    return absolute + relative * abs(magnitude) + extra


def within(diff: float, tol: float) -> bool:
    return not math.isnan(diff) and diff <= tol


def reached(updates: list[tuple[int, list[int]]], flipped: set[int]) -> tuple[list[bool], dict[int, bool]]:
    """Which updates and which rolled-out batches a bf16 flip reaches, given each update's (replayed batch,
    batches rolled out during it) and the batches whose latents flipped on any rank: an update is reached when it
    replays a flipped batch or follows a reached update; a batch when it flipped itself or was rolled out by a
    policy that a reached update made."""
    out, batches, before = [], {}, False
    for replayed, rolled in updates:
        for b in rolled:
            batches[b] = b in flipped or before
        before = before or replayed in flipped
        out.append(before)
    return out, batches


def mode_tier(mode: str, reached_here: bool) -> str:
    """The row of TOLERANCE that holds a quantity: bf16 mode's only where a flip reached it."""
    return "bf16" if mode == "bf16" and reached_here else "fp32"
