"""The prompt refiner's side of joint RL (a causal language model that rewrites each prompt before the generator
rolls out; docs/options.md#prompt-refiners; grpo/refiners.py trains it): its token-level loss and the advantages
that drive it.

A rewrite is a completion: the tokens the refiner sampled after its chat prompt, up to and including the first
end-of-sequence token (`completion_mask`; a rewrite cut at the token cap has none and counts every token). Its
per-token log-probabilities are those of the logits at the sampling temperature (`token_log_probs`: a replay at
another temperature or template than the rollout's biases every ratio). The loss per token is one of:
- `on_policy`: the surrogate -exp(logp - sg(logp)) A, whose gradient is the policy gradient at the rollout's weights
  (PromptRL's, which replays once, on policy);
- `ppo_clip`: max(-A rho, -A clip(rho, 1 - c, 1 + c_high)) with rho = exp(logp - logp_rollout) (UniRL's, whose
  ratio is anchored at the rollout's log-probabilities across every update of a batch);
plus `kl_weight` x the k3 estimate of KL to a frozen copy, exp(ref - logp) - (ref - logp) - 1, per token. The tokens'
losses are aggregated over the completions as `normalization` names it:
- `sequence_token_mean`: each completion's masked token mean, then the mean over completions (PromptRL's, UniRL's
  `seq-mean-token-mean`: every completion weighs alike, whatever its length);
- `token_mean`: the mean over every masked token of the batch (UniRL's default `token-mean`);
- `sequence_token_sum`: each completion's masked token sum over `horizon`, then the mean over completions (UniRL's
  `seq-mean-token-sum-norm`, Dr. GRPO's: no length bias).

Advantages (`refiner_advantages`): `shared` is PromptRL's, one group-relative advantage per member, clamped to +-5,
that drives its rewrite's tokens and its video's steps alike; `hierarchical` is UniRL's for N rewrites x M videos
of a prompt: a rewrite's reward is the mean of its videos', the refiner's group is the prompt's rewrites, the
generator's group a rewrite's videos, each over sqrt(population variance + 1e-8), unclamped.

May import: `grpo.advantages` and the core modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from videogrpo.grpo.advantages import group_advantages

LOSSES = ("on_policy", "ppo_clip")
NORMALIZATIONS = ("sequence_token_mean", "token_mean", "sequence_token_sum")


def completion_mask(completions: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """[B, T] int: 1 on each completion's tokens up to and including its first end-of-sequence token (every token
    of a completion without one)."""
    is_eos = completions == eos_token_id
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), completions.shape[1])
    positions = torch.arange(completions.shape[1], device=completions.device)
    return (positions.unsqueeze(0) <= first.unsqueeze(1)).int()


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, T] log-probability of each token under logits [B, T, V] at the sampling temperature (the logits at
    position t score the token at t, so a caller passes the logits shifted one left of the sequence)."""
    log_probs = (logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature).log_softmax(dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def k3_kl(log_probs: torch.Tensor, reference_log_probs: torch.Tensor) -> torch.Tensor:
    """Per token: the k3 estimate of KL(policy || reference), exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    diff = reference_log_probs - log_probs
    return torch.exp(diff) - diff - 1


@dataclass
class RefinerLoss:
    loss: torch.Tensor
    kl: torch.Tensor
    """The aggregated k3 KL (0 without a reference)."""
    clip_fraction: torch.Tensor
    """The fraction of masked tokens whose ratio left the clip range (0 on policy)."""


def token_losses(
    log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    advantages: torch.Tensor,
    loss: str,
    clip_range: float,
    clip_range_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] per-token policy loss, [B, T] clipped): advantages [B] spread over each completion's tokens."""
    adv = advantages.detach().to(log_probs.dtype).unsqueeze(1)
    if loss == "on_policy":
        return -torch.exp(log_probs - log_probs.detach()) * adv, torch.zeros_like(log_probs, dtype=torch.bool)
    if loss != "ppo_clip":
        raise ValueError(f"refiner loss {loss!r}: one of {', '.join(LOSSES)}")
    high = clip_range if clip_range_high is None else clip_range_high
    ratio = torch.exp(log_probs - rollout_log_probs.detach())
    clipped = (ratio - 1.0 > high) | (1.0 - ratio > clip_range)
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_range, 1.0 + high)), clipped


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, normalization: str, horizon: int | None = None):
    """The masked per-token values [B, T] over the batch, as `normalization` names it (the module docstring)."""
    mask = mask.to(per_token.dtype)
    if normalization == "sequence_token_mean":
        return ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)).mean()
    if normalization == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp_min(1)
    if normalization == "sequence_token_sum":
        if not horizon:
            raise ValueError("refiner normalization sequence_token_sum needs a horizon (the token cap)")
        return ((per_token * mask).sum(dim=1) / horizon).mean()
    raise ValueError(f"refiner normalization {normalization!r}: one of {', '.join(NORMALIZATIONS)}")


def refiner_loss(
    log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    loss: str,
    normalization: str,
    rollout_log_probs: torch.Tensor | None = None,
    reference_log_probs: torch.Tensor | None = None,
    kl_weight: float = 0.0,
    clip_range: float = 0.0,
    clip_range_high: float | None = None,
    horizon: int | None = None,
) -> RefinerLoss:
    """The refiner's loss over completions [B, T]: the per-token policy loss plus kl_weight x k3 KL, aggregated."""
    per_token, clipped = token_losses(log_probs, rollout_log_probs, advantages, loss, clip_range, clip_range_high)
    kl = k3_kl(log_probs, reference_log_probs) if reference_log_probs is not None else torch.zeros_like(log_probs)
    total = aggregate(per_token + kl_weight * kl, mask, normalization, horizon)
    m = mask.to(log_probs.dtype)
    fraction = (clipped.to(m.dtype) * m).sum() / m.sum().clamp_min(1)
    return RefinerLoss(total, aggregate(kl, mask, normalization, horizon).detach(), fraction.detach())


def population_advantages(rewards: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(r - group mean) / sqrt(population variance + eps) of [groups, size] rewards, unclamped (UniRL's: the eps
    inside the square root, so a group whose members all scored alike gets 0)."""
    rewards = rewards.float()
    mean = rewards.mean(dim=1, keepdim=True)
    return (rewards - mean) / (rewards.var(dim=1, unbiased=False, keepdim=True) + eps).sqrt()


def refiner_advantages(rewards: torch.Tensor, credit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the refiner's advantages, the generator's) from rewards: `shared`, [P, G] (one rewrite and one video per
    member): the same clamped group advantage for both; `hierarchical`, [P, N, M] (N rewrites of a prompt, M videos
    of each): the refiner's [P, N] over the prompt's rewrites of their videos' mean reward, the generator's
    [P, N, M] over each rewrite's videos."""
    if credit == "shared":
        adv = group_advantages(rewards, "group", unbiased=False)
        return adv, adv
    if credit == "hierarchical":
        p, n, m = rewards.shape
        return population_advantages(rewards.mean(dim=2)), population_advantages(rewards.reshape(p * n, m)).view(
            p, n, m
        )
    raise ValueError(f"refiner credit {credit!r}: one of shared, hierarchical")
