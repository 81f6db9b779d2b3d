"""Group-relative advantages (docs/reference-system.md#grpo)."""

from __future__ import annotations

import numpy as np
import torch

from videogrpo.grpo.draws import counter_seed

EPS = 1e-4
CLAMP = 5.0


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """clamp((r - mean) / (std + 1e-4), -5, 5) per row of [groups, G] rewards; std is unbiased."""
    rewards = rewards.double()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=True, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return ((rewards - mean) / (std + EPS)).clamp(-CLAMP, CLAMP).float()


def zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[groups] bool: the groups of [groups, G] rewards whose members all scored exactly alike (advantages 0)."""
    return (rewards == rewards[:, :1]).all(dim=1)


def shuffled_within_groups(advantages: torch.Tensor, seed: int, batch: int) -> torch.Tensor:
    """The placebo control (grpo.shuffle_advantages): each group's advantages permuted among its members."""
    out = advantages.clone()
    for j in range(advantages.shape[0]):
        order = np.random.default_rng(counter_seed(seed, 0x5A5A, batch, j)).permutation(advantages.shape[1])
        out[j] = advantages[j, torch.from_numpy(order)]
    return out
