"""Rollouts: run a sampler over the transformer's velocity and record every transition for replay.

All randomness is derived from counters (seed, step, prompt, group member, denoising step), not from
a stateful generator, so a rollout does not depend on how samples are spread over ranks, and a
resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from videogrpo.grpo import samplers


def frame_mask(latent_frames: int, device: torch.device, pinned: bool = True) -> torch.Tensor:
    """1 for generated latent frames, 0 for frame 0 where it is pinned to the clean image condition (TI2V);
    all ones where nothing is pinned (I2V-A14B: frame 0 is denoised and counts in log-prob and KL)."""
    mask = torch.ones(latent_frames, device=device)
    if pinned:
        mask[0] = 0
    return mask


def velocity(model, transformer, x, sigma: float, embeds, guidance_scale: float, condition):
    """The model's velocity: TI2V is conditioned through its pinned frame 0, I2V through its 36-channel input
    (`condition`, and `transformer` the experts by name)."""
    if model.pins_first_frame:
        return model.velocity(transformer, x, sigma, embeds, guidance_scale)
    return model.velocity(transformer, x, sigma, embeds, guidance_scale, condition=condition)


@dataclass
class Trajectory:
    latents: torch.Tensor
    """x_0 (noise) .. x_T (clean), [N, T + 1, C, F, h, w] in the trajectory dtype (bf16 in the reference). After a
    window's DPM-Solver tail (grpo.sde_window_tail), which runs on its own noise levels, the states between the
    window's end and x_T are NaN: they are on no step of the schedule, and nothing replays them."""
    log_probs: torch.Tensor
    """log p of each recorded transition, float32 [N, T]."""
    etas: torch.Tensor
    """Sampler noise level of each sample, [N]."""
    means: torch.Tensor | None = None
    """The rollout policy's transition mean of each step, float32 [N, T, C, F, h, w] (kept for GRPO-Guard only)."""


@torch.no_grad()
def rollout(
    model,
    transformer: torch.nn.Module,
    embeds: torch.Tensor,
    condition: torch.Tensor,
    init_noise: torch.Tensor,
    sigmas: torch.Tensor,
    sampler: str,
    etas: torch.Tensor,
    step_noise,
    guidance_scale: float = 1.0,
    window: tuple[int, int] | None = None,
    keep_means: bool = False,
    tail: torch.Tensor | None = None,
) -> Trajectory:
    """Denoise init_noise [N, C, F, h, w]: TI2V's conditioned on latent frame 0 = condition [N, C, 1, h, w]
    (pinned), I2V's on its condition [N, 4 + C, F, h, w] (mask and first-frame latent; nothing pinned).

    `step_noise(i)` gives the eps [N, C, F, h, w] of denoising step i. Latents are kept in the
    model's trajectory dtype, as replay will see them. With an SDE `window` [start, end) only its steps sample
    with the sampler; the others take the deterministic Euler step, draw no noise and record log p 0 (never
    replayed: grpo.sde_window_size); the `euler` sampler takes it on every step, and `dpm_solver` DPM-Solver++ (2M)
    on every step (`samplers.dpm_solver_step`; DiffusionNFT's deterministic samplers). `keep_means`: record
    each step's transition mean (GRPO-Guard). `tail`: the noise levels from the window's end down
    (samplers.respaced_tail), which the DPM-Solver takes after the window instead of the Euler steps.
    """
    pinned = model.pins_first_frame
    mask = frame_mask(init_noise.shape[2], init_noise.device, pinned)
    dtype = model.trajectory_dtype
    x = init_noise.to(dtype).clone()
    if pinned:
        condition = condition.to(dtype)
        x[:, :, :1] = condition
    states, log_probs, means = [x], [], []
    steps = len(sigmas) - 1
    end = window[1] if tail is not None and window[1] < steps else steps
    before = None  # the DPM-Solver's previous (x0, sigma)
    for i in range(end):
        sigma, sigma_next = float(sigmas[i]), float(sigmas[i + 1])
        v = velocity(model, transformer, x, sigma, embeds, guidance_scale, condition)
        if end < steps:  # the solver's history: the tail's first step takes the window's last x0
            before = (x.float() - sigma * v.float(), sigma)
        if sampler == "dpm_solver":
            x, before = samplers.dpm_solver_velocity_step(x, v, sigma, sigma_next, before, dtype)
            mean, logp = x.float(), torch.zeros(x.shape[0], device=x.device)
        elif sampler != "euler" and (window is None or window[0] <= i < window[1]):
            x, mean, logp = samplers.step(sampler, x, v, sigma, sigma_next, etas, step_noise(i), mask, dtype)
        else:
            x, logp = samplers.euler_step(x, v, sigma, sigma_next, dtype), torch.zeros(x.shape[0], device=x.device)
            mean = x.float()
        if keep_means:
            means.append(mean.float())
        if pinned:
            x[:, :, :1] = condition
        states.append(x)
        log_probs.append(logp)
    if end < steps:  # the DPM-Solver tail: its own noise levels; only its final state is kept (x_T)
        for k in range(len(tail) - 1):
            sigma, sigma_next = float(tail[k]), float(tail[k + 1])
            v = velocity(model, transformer, x, sigma, embeds, guidance_scale, condition)
            x, before = samplers.dpm_solver_velocity_step(x, v, sigma, sigma_next, before, dtype)
            if pinned:
                x[:, :, :1] = condition
        states += [torch.full_like(x, float("nan"))] * (steps - end - 1) + [x]
        log_probs += [torch.zeros(x.shape[0], device=x.device)] * (steps - end)
        means += [torch.full_like(x, float("nan"), dtype=torch.float32)] * (steps - end) if keep_means else []
    kept = torch.stack(means, dim=1) if keep_means else None
    return Trajectory(torch.stack(states, dim=1), torch.stack(log_probs, dim=1), etas, kept)


@dataclass
class Replayed:
    """One recorded transition recomputed by the current policy (with gradients)."""

    log_prob: torch.Tensor
    """log p of the recorded next latent, [N]."""
    mean: torch.Tensor
    """Transition mean mu, float32 [N, C, F, h, w]."""
    std: torch.Tensor
    """Transition noise std, broadcastable to mean."""


def replay_log_prob(
    model,
    transformer: torch.nn.Module,
    trajectory: Trajectory,
    index: int,
    sigmas: torch.Tensor,
    sampler: str,
    embeds: torch.Tensor,
    guidance_scale: float = 1.0,
    condition: torch.Tensor | None = None,
) -> Replayed:
    """Recompute log p of the recorded transition `index` under `transformer` (I2V: with its `condition`, routed
    by the same stored sigma as in the rollout)."""
    x = trajectory.latents[:, index]
    x_next = trajectory.latents[:, index + 1]
    sigma, sigma_next = float(sigmas[index]), float(sigmas[index + 1])
    mask = frame_mask(x.shape[2], x.device, model.pins_first_frame)
    v = velocity(model, transformer, x, sigma, embeds, guidance_scale, condition)
    mean, std = samplers.transition(sampler, x, v, sigma, sigma_next, trajectory.etas)
    return Replayed(samplers.log_prob(sampler, x_next, mean, std, mask), mean, std)
