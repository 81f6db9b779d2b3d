"""Denoising without log-probabilities, for a video that is looked at rather than trained on: the evaluation
matrix's cells (`evaluation.sampling`) and validation during training (`validation`) both sample through here.

`sample_latents` runs a Gaussian transition of training (`SDE`: `samplers.transition`, the one the rollout steps
with), training's DPM-Solver (`Solver`) or a diffusers ODE scheduler (`ODE`: the steps of diffusers' Wan pipelines),
the latent in float32 between steps. TI2V pins latent frame 0 to its condition before the first step and after every
step; I2V pins nothing (`model.pins_first_frame`). `weights` is what the model's velocity takes: a TI2V transformer,
or an I2V model's experts by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from videogrpo.grpo import samplers
from videogrpo.grpo.rollout import velocity


def pin(model, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """x with TI2V's latent frame 0 set to the first frame's latent (cast to x's dtype); I2V's unchanged."""
    if model.pins_first_frame:
        x[:, :, :1] = condition
    return x


@dataclass(frozen=True)
class SDE:
    """A Gaussian sampler of training (`grpo.samplers`) over a sigma schedule of T + 1 values."""

    sampler: str
    sigmas: torch.Tensor
    eta: float | torch.Tensor
    """The noise level, one for all or one per sample [B]."""
    step_noise: Callable[[int], torch.Tensor]
    """The eps [B, C, F, h, w] of denoising step i."""


@dataclass(frozen=True)
class Solver:
    """DPM-Solver++ (2M) over a sigma schedule of T + 1 values (`samplers.dpm_solver_step`, the steps of training's
    `dpm_solver` rollouts)."""

    sigmas: torch.Tensor


@dataclass(frozen=True)
class ODE:
    """A diffusers scheduler (UniPC, flow-matching Euler) run for `steps` steps."""

    scheduler: object
    steps: int


def ode_scheduler(kind: str, model_dir: Path, shift: float):
    """The diffusers scheduler of an ODE sampler (`euler`, `unipc`): a new one per call (UniPC keeps state)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if kind == "euler":
        return FlowMatchEulerDiscreteScheduler(shift=shift)
    path = Path(model_dir) / "scheduler" / "scheduler_config.json"
    if path.is_file() and json.loads(path.read_text()).get("_class_name") == "UniPCMultistepScheduler":
        return UniPCMultistepScheduler.from_pretrained(Path(model_dir) / "scheduler")
    # Wan2.2's own scheduler settings (its Diffusers snapshots ship this UniPC).
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift)


@torch.no_grad()
def sample_latents(
    model,
    weights,
    embeds: torch.Tensor,
    condition: torch.Tensor,
    init: torch.Tensor,
    how: SDE | Solver | ODE,
    guidance_scale: float = 1.0,
) -> torch.Tensor:
    """The clean latents [B, C, F, h, w] (float32) denoised from the noise `init` by `how`."""
    dtype = torch.float32
    x = pin(model, init.to(dtype).clone(), condition)
    if isinstance(how, SDE):
        for i in range(len(how.sigmas) - 1):
            sigma, sigma_next = float(how.sigmas[i]), float(how.sigmas[i + 1])
            v = velocity(model, weights, x, sigma, embeds, guidance_scale, condition)
            mean, std = samplers.transition(how.sampler, x, v, sigma, sigma_next, how.eta)
            # samplers.step's x', without the log-probability nobody here has a use for.
            x = pin(model, (mean + std * how.step_noise(i).float()).to(dtype), condition)
        return x
    if isinstance(how, Solver):
        before = None
        for i in range(len(how.sigmas) - 1):
            sigma, sigma_next = float(how.sigmas[i]), float(how.sigmas[i + 1])
            v = velocity(model, weights, x, sigma, embeds, guidance_scale, condition)
            x, before = samplers.dpm_solver_velocity_step(x, v, sigma, sigma_next, before, dtype)
            x = pin(model, x, condition)
        return x
    scheduler = how.scheduler
    scheduler.set_timesteps(how.steps, device=x.device)
    for t in scheduler.timesteps:
        v = velocity(
            model, weights, x, float(t) / scheduler.config.num_train_timesteps, embeds, guidance_scale, condition
        )
        x = pin(model, scheduler.step(v, t, x, return_dict=False)[0].to(dtype), condition)
    return x
