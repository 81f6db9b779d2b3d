"""This project's advantages with the presets' settings (grpo.advantage_std, _unbiased, _eps) against the authors'
own stat tracker (README.md beside this file).

    python tools/algo_diff/advantages.py CHECKOUT [--commit C] [--store FILE]

CHECKOUT: a checkout of yifan123/flow_grpo or NVlabs/DiffusionNFT (each ships `flow_grpo/stat_tracking.py`), its
git directory, or a plain copy of its tree. The tool loads their `PerPromptStatTracker` by path and runs its
`update` on a gathered batch of rewards (5 prompts x 6 members: spread groups, a group whose members all scored
alike, a group of two values), with `global_std` True (Flow-GRPO-Fast's and DiffusionNFT's configs: one population
std over the batch) and False (GRPO-Guard's: each prompt's), then clamps to +-5 as their losses do (their
`adv_clip_max`). Beside it, `advantages.group_advantages` with `advantage_std` batch or group, `unbiased` false and
eps 1e-4. Compared: every advantage.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys

import torch
from checkout import relative_differences, run_module_comparison

TRACKER_FILE = "flow_grpo/stat_tracking.py"
CLIP = 5.0
"""Their adv_clip_max (config/base.py), the clamp their losses put on an advantage."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = f"PerPromptStatTracker.update, global_std True and False, clamped to +-{CLIP}"
"""What a run compares, as it prints it."""


def inputs() -> dict:
    """Rewards of 5 prompts x 6 members (seeded, with a tied group and a two-valued one)."""
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(5, 6, generator=generator, dtype=torch.float64)
    rewards[1] = 0.25  # every member alike: advantage 0
    rewards[3] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    rewards[4, :3] *= 10  # a spread group beside small ones: the batch's std is mostly its
    return {"rewards": rewards}


def authors_side(module, data: dict) -> dict:
    """Their tracker's update on the flattened batch, clamped to +-CLIP, for global_std True and False."""
    rewards = data["rewards"]
    prompts = [f"prompt {i}" for i in range(rewards.shape[0]) for _ in range(rewards.shape[1])]
    out = {}
    for name, global_std in (("batch_std", True), ("group_std", False)):
        tracker = module.PerPromptStatTracker(global_std)
        found = torch.as_tensor(tracker.update(prompts, rewards.flatten().numpy()))
        out[name] = found.clamp(-CLIP, CLIP).view_as(rewards)
    return out


def project_side(data: dict) -> dict:
    """This project's group advantages with the presets' std settings."""
    from videogrpo.grpo.advantages import group_advantages

    rewards = data["rewards"]
    return {
        name: group_advantages(rewards, over, unbiased=False, eps=1e-4).double()
        for name, over in (("batch_std", "batch"), ("group_std", "group"))
    }


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per std setting."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    return run_module_comparison(__doc__, "flow_grpo or DiffusionNFT", argv, TRACKER_FILE, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
