"""Rollout transitions over the model's velocity (docs/reference-system.md#grpo).

Each sampler maps (x, v, sigma, sigma') to a Gaussian transition: a mean mu, a noise std, and a
log-probability of the next latent. Notation: x0_hat = x - sigma v, x1_hat = x + (1 - sigma) v.
Transitions run in float32. The next latent is stored in the trajectory dtype (bf16 in the
reference) and its log-probability is taken of the stored value, so that replaying it on-policy
gives a ratio of exactly 1.
"""

from __future__ import annotations

import math

import torch

SAMPLERS = ("flowcps", "dancegrpo", "flowgrpo", "flowgrpo_sde")


def sigma_schedule(steps: int, shift: float) -> torch.Tensor:
    """sigma = shift t / (1 + (shift - 1) t) over t = linspace(1, 0, steps + 1), float64."""
    t = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return shift * t / (1 + (shift - 1) * t)


def _per_sample(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A scalar or per-sample [B] value shaped to broadcast over [B, ...]."""
    value = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if value.ndim == 0:
        return value
    return value.view(-1, *([1] * (like.ndim - 1)))


def transition(
    sampler: str, x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float, eta: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and noise std of x' given x (std broadcastable to x; eta may be per sample)."""
    x, v = x.float(), v.float()
    eta = _per_sample(eta, x)
    d = sigma_next - sigma
    if sampler == "flowcps":
        std = sigma_next * torch.sin(eta * math.pi / 2)
        x0_hat = x - sigma * v
        x1_hat = x + (1 - sigma) * v
        # sqrt(sigma'^2 - s^2) in closed form: the difference of squares loses precision as eta -> 1.
        mean = (1 - sigma_next) * x0_hat + sigma_next * torch.cos(eta * math.pi / 2) * x1_hat
        return mean, std
    if sampler == "dancegrpo":
        std = eta * math.sqrt(sigma - sigma_next)
        mean = x + d * (v + eta**2 * (x + (1 - sigma) * v) / (2 * sigma))
        return mean, std
    if sampler in ("flowgrpo", "flowgrpo_sde"):
        if sigma == 0:
            return x + d * v, torch.zeros((), device=x.device)
        if sampler == "flowgrpo":
            # Wan ports of Flow-GRPO: s_t = sigma_min + (sigma_max - sigma_min) sigma with 0 and 1, i.e. sigma.
            s_t = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        else:
            # Flow-GRPO's own `sde` step (its image models; MixGRPO's window, GRPO-Guard): s_t = eta sqrt(sigma /
            # (1 - sigma)), where sigma = 1 takes the schedule's second noise level instead, as theirs
            # (scheduler.sigmas[1], the first step's sigma').
            at = torch.as_tensor(sigma_next if sigma == 1 else sigma, dtype=torch.float32, device=x.device)
            s_t = torch.sqrt(torch.as_tensor(sigma, dtype=torch.float32, device=x.device) / (1 - at)) * eta
        mean = x * (1 + s_t**2 * d / (2 * sigma)) + v * (1 + s_t**2 * (1 - sigma) / (2 * sigma)) * d
        return mean, s_t * math.sqrt(-d)
    raise ValueError(f"unknown sampler {sampler!r}; known: {SAMPLERS}")


def masked_mean(values: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over all but the batch dim; with a [F] frame mask, only over latent frames where it is 1."""
    if frame_mask is None:
        return values.flatten(1).mean(dim=1)
    values = values[:, :, frame_mask.bool()]
    return values.flatten(1).mean(dim=1)


def log_prob(
    sampler: str, x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, frame_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample log-probability of x_next [B, C, F, h, w] (frames outside frame_mask left out)."""
    x_next, mean = x_next.float(), mean.float()
    if sampler == "flowcps":
        # Flow-CPS drops the variance and constants: log p = -mean((x' - mu)^2).
        return -masked_mean((x_next - mean) ** 2, frame_mask)
    std = torch.as_tensor(std, dtype=torch.float32, device=x_next.device)
    if std.ndim > 0:
        std = std.view(-1, *([1] * (x_next.ndim - 1)))
    terms = -((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))
    return masked_mean(terms.expand_as(x_next), frame_mask)


def kl_divergence(
    sampler: str, mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor, frame_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """KL term to the frozen reference policy (scalar): mean((mu - mu_ref)^2), divided by 2 s^2 for the
    Gaussian samplers (Flow-CPS drops the variance, as its log-prob does); 0 where s vanishes."""
    mse = masked_mean((mean.float() - ref_mean.float()) ** 2, frame_mask)
    if sampler == "flowcps":
        return mse.mean()
    std = torch.as_tensor(std, dtype=torch.float32, device=mean.device).flatten().expand(mse.shape)
    safe = torch.where(std > 1e-8, std, torch.ones_like(std))
    return torch.where(std > 1e-8, mse / (2 * safe**2), torch.zeros_like(mse)).mean()


def euler_step(x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float, dtype: torch.dtype) -> torch.Tensor:
    """The deterministic Euler ODE step x' = x + (sigma' - sigma) v, in float32, stored in `dtype` (what every
    sampler becomes at noise level 0; the steps outside an SDE window)."""
    return (x.float() + (sigma_next - sigma) * v.float()).to(dtype)


def respaced_tail(steps: int, shift: float, end: int, points: int) -> torch.Tensor:
    """MixGRPO-Flash's schedule after an SDE window ending at step `end`: `points` noise levels from sigma_end down to
    0, evenly spaced in the unshifted time t and then shifted as `sigma_schedule` (float64). Its first is exactly
    sigma_end; one point alone is sigma_end itself, and the sample ends there, at a noise level above 0, as their
    code does (docs/fidelity.md)."""
    t_end = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)[end]
    t = torch.linspace(float(t_end), 0.0, points, dtype=torch.float64)
    return shift * t / (1 + (shift - 1) * t)


def _log_snr(sigma: float) -> torch.Tensor:
    """lambda = log(alpha) - log(sigma) with alpha = 1 - sigma (float64; +inf at sigma 0, -inf at sigma 1)."""
    s = torch.tensor(sigma, dtype=torch.float64)
    return torch.log1p(-s) - torch.log(s)


def dpm_solver_step(
    x: torch.Tensor,
    x0: torch.Tensor,
    sigma: float,
    sigma_next: float,
    before: tuple[torch.Tensor, float] | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """One deterministic DPM-Solver++ step (the data-prediction multistep solver, MixGRPO-Flash's tail) from x at
    sigma to sigma_next, given this step's x0 = x - sigma v. `before`: the previous step's (x0, sigma), which makes it
    the second-order midpoint update; None, or a step to sigma 0 (the solver's last, as theirs), takes the first
    order. Coefficients in float64, the update in float32, stored in `dtype`."""
    x, x0 = x.float(), x0.float()
    lam_s, lam_t = _log_snr(sigma), _log_snr(sigma_next)
    h = lam_t - lam_s
    # -alpha_t (e^-h - 1); at sigma_next 0 it is 1 and sigma_next / sigma is 0: the step lands on x0.
    c = float(-(1 - sigma_next) * torch.expm1(-h))
    ratio = sigma_next / sigma
    if before is None or sigma_next == 0:
        return (ratio * x + c * x0).to(dtype)
    x0_before, sigma_before = before
    r = float((lam_s - _log_snr(sigma_before)) / h)
    d1 = (x0 - x0_before.float()) / r
    return (ratio * x + c * x0 + 0.5 * c * d1).to(dtype)


def dpm_solver_velocity_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: float,
    sigma_next: float,
    before: tuple[torch.Tensor, float] | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, tuple[torch.Tensor, float]]:
    """`dpm_solver_step` from the velocity v at x: (x', the history its next step takes, (x0, sigma))."""
    x0 = x.float() - sigma * v.float()
    return dpm_solver_step(x, x0, sigma, sigma_next, before, dtype), (x0, sigma)


def step(
    sampler: str,
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: float,
    sigma_next: float,
    eta: float | torch.Tensor,
    noise: torch.Tensor,
    frame_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample x' = mu + std eps, stored in `dtype`; returns (x', mu, log p(x')) with log p of the stored x'."""
    mean, std = transition(sampler, x, v, sigma, sigma_next, eta)
    x_next = (mean + std * noise.float()).to(dtype)
    return x_next, mean, log_prob(sampler, x_next, mean, std, frame_mask)
