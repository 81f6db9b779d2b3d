"""DiffusionNFT (grpo.algorithm = nft, docs/options.md#diffusionnft): a policy objective on the forward (noising)
process, with no log-probability, so any sampler trains it, the deterministic ODE included.

Each trained (rollout, noise level t) pair noises the rollout's clean latent x0 afresh, xt = (1 - t) x0 + t eps, and
asks the current policy v and the old policy v_old (the one that sampled the data) for the velocity at xt. Two
implicit policies are reflections through v_old: v+ = beta v + (1 - beta) v_old and v- = (1 + beta) v_old - beta v.
The advantage sets an optimality probability r = clip(0.5 + clip(A, +-c) / (2c), 0, 1), and the loss pulls v+'s
clean prediction to x0 with weight r and v-'s with weight 1 - r, each error scaled by its own detached mean
absolute error:

    loss = mean over rows of c (r L+ + (1 - r) L-) / beta,   L+- = mean((x0+- - x0)^2) / max(mean|x0+- - x0|, 1e-5).

The old policy is a copy of the trainable weights (`weight_copy.WeightCopy`) mixed toward the trained ones after
every optimizer update, old <- d old + (1 - d) new, with d = min(rate x max(update - after, 0), max) (0 before
`after` updates: on-policy). Rollouts sample with it, as the authors' do.

May import: torch and `grpo.samplers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from videogrpo.grpo.samplers import masked_mean

NOISE_TAG = 0x4E57
"""The key slot of the forward process's noise (training's other draws use others)."""
PASS_TAG = 0x9A55
"""Marks the pass of a batch's second and later passes in that noise's key (grpo.update_passes)."""


@dataclass
class NFTStats:
    positive_loss: float
    """Mean of L+ over the rows."""
    negative_loss: float
    """Mean of L- over the rows."""
    optimality_mean: float
    """Mean of r over the rows."""


def optimality(advantages: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """r = clip(clip(A, -c, c) / c / 2 + 0.5, 0, 1): the advantage as a probability that a rollout is optimal."""
    clipped = torch.clamp(advantages.float(), -adv_clip, adv_clip)
    return torch.clamp(clipped / adv_clip / 2 + 0.5, 0, 1)


def noised(x0: torch.Tensor, t: float, eps: torch.Tensor) -> torch.Tensor:
    """The forward process (rectified flow): xt = (1 - t) x0 + t eps, float32."""
    return (1 - t) * x0.float() + t * eps.float()


def nft_objective(
    v: torch.Tensor,
    v_old: torch.Tensor,
    xt: torch.Tensor,
    x0: torch.Tensor,
    t: float | torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
    adv_clip: float,
    frame_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, L+, L-, r) of the rows [N, C, F, h, w]: `t` a number or one per row; means over the frames of
    `frame_mask` (a pinned frame 0 carries no signal)."""
    v, v_old, xt, x0 = v.float(), v_old.float().detach(), xt.float(), x0.float()
    t = torch.as_tensor(t, dtype=torch.float32, device=v.device)
    if t.ndim:
        t = t.view(-1, *([1] * (v.ndim - 1)))
    r = optimality(advantages, adv_clip)
    v_pos = beta * v + (1 - beta) * v_old
    v_neg = (1 + beta) * v_old - beta * v
    terms = []
    for velocity in (v_pos, v_neg):
        error = xt - t * velocity - x0
        with torch.no_grad():  # float64, as the authors': the weights of small errors stay exact
            weight = masked_mean(error.double().abs(), frame_mask).clamp(min=1e-5)
        terms.append(masked_mean(error**2, frame_mask) / weight.float())
    positive, negative = terms
    loss = (adv_clip * (r * positive / beta + (1 - r) * negative / beta)).mean()
    return loss, positive, negative, r


def nft_loss(*args, **kwargs) -> tuple[torch.Tensor, NFTStats]:
    """`nft_objective`'s loss and its diagnostics as Python numbers (which read the values: not on fake tensors)."""
    loss, positive, negative, r = nft_objective(*args, **kwargs)
    with torch.no_grad():
        stats = NFTStats(positive.mean().item(), negative.mean().item(), r.mean().item())
    return loss, stats


def old_decay(update: int, rate: float, ceiling: float, after: int) -> float:
    """The old policy's decay after `update` optimizer updates: 0 up to `after`, then rate x (update - after),
    at most `ceiling` (grpo.nft_old_decay_rate, _max, _after)."""
    if update < after:
        return 0.0
    return min((update - after) * rate, ceiling)
