"""The PPO-clipped GRPO objective per replayed timestep, and its diagnostics."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PPOStats:
    ratio_mean: float
    ratio_abs_max: float
    clip_fraction: float
    approx_kl: float


def ppo_objective(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    clip_range_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, rho, log rho): mean(max(-A rho, -A clip(rho, 1 - c, 1 + c_high))) with rho = exp(logp_new - logp_old);
    c_high is clip_range_high, or c when it is None (symmetric, as the reference)."""
    log_ratio = logp_new - logp_old.detach()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    high = clip_range if clip_range_high is None else clip_range_high
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + high)
    return torch.maximum(unclipped, clipped).mean(), ratio, log_ratio


def guard_log_ratio(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    mean_new: torch.Tensor,
    mean_old: torch.Tensor,
    std: torch.Tensor,
    frame_mask: torch.Tensor | None = None,
    per_row: bool = True,
) -> torch.Tensor:
    """GRPO-Guard's normalised log-ratio of a Gaussian step, per row: (log p_new - log p_old + mean((mu_new -
    mu_old)^2) / (2 s^2)) x s, the mean-shift term (always <= 0) added back and the step's std s taken out; it equals
    mean(eps (mu_new - mu_old)) with eps = (x' - mu_old) / s the rollout's noise, whatever the noise level. `std`:
    the transition's std, a number or one per row; means over the frames of `frame_mask` as the log-probability's.
    `per_row` false: the mean-shift term and the std are the means over all rows (grpo.grpo_guard_scope micro_batch,
    as its authors' code computes them over a micro-batch)."""
    from videogrpo.grpo.samplers import masked_mean

    s = torch.as_tensor(std, dtype=torch.float32, device=mean_new.device).flatten()
    shift = masked_mean((mean_new.float() - mean_old.float().detach()) ** 2, frame_mask)
    if not per_row:
        s, shift = s.mean(), shift.mean()
    return (logp_new - logp_old.detach() + shift / (2 * s**2)) * s


def ppo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    clip_range_high: float | None = None,
) -> tuple[torch.Tensor, PPOStats]:
    """`ppo_objective`'s loss and its diagnostics as Python numbers (which read the values: not on fake tensors).
    The clip fraction counts the ratios outside [1 - c, 1 + c_high]."""
    loss, ratio, log_ratio = ppo_objective(logp_new, logp_old, advantages, clip_range, clip_range_high)
    with torch.no_grad():
        if clip_range_high is None:  # the reference's count, kept as written
            clipped = (ratio - 1).abs() > clip_range
        else:
            clipped = (ratio < 1.0 - clip_range) | (ratio > 1.0 + clip_range_high)
        stats = PPOStats(
            ratio_mean=ratio.mean().item(),
            ratio_abs_max=(ratio - 1).abs().max().item(),
            clip_fraction=clipped.float().mean().item(),
            approx_kl=(ratio - 1 - log_ratio).mean().item(),
        )
    return loss, stats
