"""This project's sampler steps against Flow-GRPO's own step function (yifan123/flow_grpo's `sde_step_with_logprob`,
the step of Flow-GRPO, Flow-GRPO-Fast's SDE window and GRPO-Guard), on the same tensors (README.md beside this file).

    python tools/algo_diff/flow_grpo_steps.py FLOW_GRPO [--commit C] [--store FILE]

FLOW_GRPO: a checkout of flow_grpo, its git directory (a clone or bare mirror), or a plain copy of its tree. The
authors' file is loaded from there by path (never copied into this project). For every step of a 10-step
FlowMatchEulerDiscreteScheduler schedule (shift 3, as their SD3 configs) and two random batches it compares:
- `cps` (Coefficients-Preserving Sampling at noise level 0.8, Flow-GRPO-Fast's sampler): the transition mean, its
  std and the log-probability of a given next latent against this project's `flowcps` sampler at eta 0.8;
- noise level 0 (the steps outside an SDE window): their mean against this project's Euler ODE step.
- their `sde` type at noise level 0.7 (std noise_level sqrt(sigma / (1 - sigma)) sqrt(-dt): MixGRPO's window
  and GRPO-Guard's sampler): the transition mean and the log-probability against this project's `flowgrpo_sde`
  sampler at eta 0.7, at every step but the last (whose std they leave undefined at sigma' = 0).
This project's `flowgrpo` sampler is the reference system's Wan port (std sigma sqrt(-dt)), another formula by
design, and is not compared.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from checkout import arguments, load_module, print_rows, relative_differences, store

STEP_FILE = "flow_grpo/diffusers_patch/sd3_sde_with_logprob.py"
STEPS, SHIFT, CPS_NOISE, SDE_NOISE = 10, 3.0, 0.8, 0.7
SHAPE = (2, 4, 6, 6)  # [B, C, H, W]: an image latent; this project's video latent is [B, C, F, h, w] with F = 1
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off (both sides compute in float32)."""


def load_step_function(source: Path, commit: str) -> tuple:
    """(the authors' `sde_step_with_logprob`, the commit or "unknown (not a git checkout)")."""
    module, where = load_module(source, commit, STEP_FILE, "flow_grpo_sde_step")
    return module.sde_step_with_logprob, where


def inputs() -> dict:
    """The schedule and, per step, a latent, a velocity and a next latent (seeded)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    scheduler.set_timesteps(STEPS)
    generator = torch.Generator().manual_seed(0)
    draw = lambda: torch.randn(STEPS, *SHAPE, generator=generator)  # noqa: E731
    return {
        "sigmas": scheduler.sigmas.clone(),
        "timesteps": scheduler.timesteps.clone(),
        "sample": draw(),
        "velocity": draw(),
        "next_sample": draw(),
    }


def authors_side(step_function, data: dict) -> dict:
    """Their step at every index: cps (mean, std, log p of the next sample), noise 0 (mean) and sde (mean, log p)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    scheduler.set_timesteps(STEPS)
    out = {k: [] for k in ("cps_mean", "cps_std", "cps_log_prob", "ode_mean", "sde_mean", "sde_log_prob")}
    for i in range(STEPS):
        t = data["timesteps"][i].repeat(SHAPE[0])
        x, v, nxt = data["sample"][i], data["velocity"][i], data["next_sample"][i]
        _, logp, mean, std = step_function(scheduler, v, t, x, CPS_NOISE, prev_sample=nxt, sde_type="cps")
        out["cps_mean"].append(mean)
        out["cps_std"].append(std.flatten()[:1].expand(SHAPE[0]).clone())
        out["cps_log_prob"].append(logp)
        _, _, mean, _ = step_function(scheduler, v, t, x, 0.0, prev_sample=nxt, sde_type="sde")
        out["ode_mean"].append(mean)
        if i < STEPS - 1:  # at sigma' = 0 their SDE's std vanishes
            _, logp, mean, _ = step_function(scheduler, v, t, x, SDE_NOISE, prev_sample=nxt, sde_type="sde")
            out["sde_mean"].append(mean)
            out["sde_log_prob"].append(logp)
    return {k: torch.stack(v) for k, v in out.items()}


def project_side(data: dict) -> dict:
    """This project's flowcps transition and log-probability at eta 0.8, and its Euler ODE step, per index."""
    from videogrpo.grpo import samplers

    out = {k: [] for k in ("cps_mean", "cps_std", "cps_log_prob", "ode_mean", "sde_mean", "sde_log_prob")}
    for i in range(STEPS):
        sigma, sigma_next = float(data["sigmas"][i]), float(data["sigmas"][i + 1])
        x, v, nxt = (data[k][i].unsqueeze(2) for k in ("sample", "velocity", "next_sample"))  # F = 1
        mean, std = samplers.transition("flowcps", x, v, sigma, sigma_next, CPS_NOISE)
        out["cps_mean"].append(mean.squeeze(2))
        out["cps_std"].append(torch.as_tensor(std, dtype=torch.float32).flatten()[:1].expand(SHAPE[0]).clone())
        out["cps_log_prob"].append(samplers.log_prob("flowcps", nxt, mean, std))
        out["ode_mean"].append(samplers.euler_step(x, v, sigma, sigma_next, torch.float32).squeeze(2))
        if i < STEPS - 1:
            mean, std = samplers.transition("flowgrpo_sde", x, v, sigma, sigma_next, SDE_NOISE)
            out["sde_mean"].append(mean.squeeze(2))
            out["sde_log_prob"].append(samplers.log_prob("flowgrpo_sde", nxt, mean, std))
    return {k: torch.stack(v) for k, v in out.items()}


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "flow_grpo", argv)
    try:
        step_function, commit = load_step_function(args.checkout.resolve(), args.commit)
    except OSError as err:
        print(f"flow_grpo_steps: could not load {STEP_FILE} from {args.checkout}: {err}", file=sys.stderr)
        return 2
    data = inputs()
    theirs = authors_side(step_function, data)
    print(f"flow_grpo at {commit}: {STEP_FILE}, {STEPS} steps, shift {SHIFT}")
    ok = print_rows(compare(theirs, project_side(data)))
    store(args.store, {"commit": commit, "inputs": data, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
