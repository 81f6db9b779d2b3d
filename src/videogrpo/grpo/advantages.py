"""Group-relative advantages (docs/reference-system.md#grpo)."""

from __future__ import annotations

import numpy as np
import torch

from videogrpo.grpo.draws import counter_seed

EPS = 1e-4
CLAMP = 5.0


def group_advantages(
    rewards: torch.Tensor, std_over: str = "group", unbiased: bool = True, eps: float = EPS
) -> torch.Tensor:
    """clamp((r - group mean) / (std + eps), -5, 5) of [groups, G] rewards. The reference's std is each group's,
    unbiased, eps 1e-4; `std_over` "batch" takes one std over every reward of the batch (Flow-GRPO's global_std),
    and `unbiased` False the population std (numpy's, as Flow-GRPO's and DiffusionNFT's stat trackers)."""
    rewards = rewards.double()
    mean = rewards.mean(dim=1, keepdim=True)
    if std_over == "batch":
        std = rewards.std(unbiased=unbiased) if rewards.numel() > 1 else torch.zeros(())
    else:
        std = rewards.std(dim=1, unbiased=unbiased, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return ((rewards - mean) / (std + eps)).clamp(-CLAMP, CLAMP).float()


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
