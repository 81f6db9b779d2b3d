"""Group-relative advantages (docs/reference-system.md#grpo)."""

from __future__ import annotations

import torch

EPS = 1e-4
CLAMP = 5.0


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """clamp((r - mean) / (std + 1e-4), -5, 5) per row of [groups, G] rewards; std is unbiased."""
    rewards = rewards.double()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=True, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return ((rewards - mean) / (std + EPS)).clamp(-CLAMP, CLAMP).float()
