"""This project's `dpm_solver` rollouts (grpo.sampler, DiffusionNFT's deterministic sampler) against its authors'
own sampling loop (NVlabs/DiffusionNFT, flow_grpo/diffusers_patch/solver.py), on the same stand-in transformer
(README.md beside this file).

    python tools/algo_diff/nft_rollout.py DIFFUSION_NFT [--commit C] [--store FILE]

DIFFUSION_NFT: a checkout of DiffusionNFT, its git directory (a clone or bare mirror), or a plain copy of its tree.
The tool loads their `solver.py` by path and runs their `run_sampling` with `solver="dpm2"` and `determistic=True`
(their config's rollouts: DPM-Solver++ (2M), DDIM on the first step, the clean prediction on the last) over a
stand-in velocity: a fixed random channel mix of the latent, scaled by the noise level, so that every step's
velocity depends on the state as a transformer's would. Beside it, this project's `rollout.rollout` with sampler
`dpm_solver` over the same velocity, from the same initial noise. Compared, for their 10-step schedule (shift 3:
their SD3 config) and a 6-step one:
- every state of the trajectory, the initial noise to the clean latent (their all_latents, this project's
  trajectory latents).

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from checkout import relative_differences, run_module_comparison

SOLVER_FILE = "flow_grpo/diffusers_patch/solver.py"
SHAPE = (2, 4, 3, 6, 6)  # [B, C, F, h, w]: a video latent; theirs runs on any shape
SCHEDULES = {"steps10": (10, 3.0), "steps6": (6, 3.0)}
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = "run_sampling(solver='dpm2', determistic=True)"
"""What a run compares, as it prints it."""


def inputs() -> dict:
    """The initial noise, the stand-in's channel mix and bias, and each schedule's sigmas (float32, as their
    scheduler's), seeded."""
    from videogrpo.grpo.samplers import sigma_schedule

    generator = torch.Generator().manual_seed(0)
    channels = SHAPE[1]
    return {
        "noise": torch.randn(*SHAPE, generator=generator),
        "mix": torch.randn(channels, channels, generator=generator) / channels**0.5,
        "bias": torch.randn(channels, generator=generator),
        **{name: sigma_schedule(steps, shift).float() for name, (steps, shift) in SCHEDULES.items()},
    }


def stand_in_velocity(data: dict):
    """v(x, sigma): a channel mix of x plus a bias, scaled by (1 + sigma) so each step sees its own noise level."""

    def velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
        mixed = torch.einsum("dc,bc...->bd...", data["mix"], x.float())
        return (mixed + data["bias"].view(1, -1, 1, 1, 1)) * (1 + float(sigma))

    return velocity


def authors_side(module, data: dict) -> dict:
    """Their run_sampling with the dpm2 solver, deterministic, per schedule: every state."""
    velocity = stand_in_velocity(data)
    out = {}
    for name in SCHEDULES:
        _, states, _ = module.run_sampling(
            lambda z, sigma: velocity(z, sigma), data["noise"].clone(), data[name], solver="dpm2", determistic=True
        )
        out[name] = torch.stack(states, dim=1)
    return out


def project_side(data: dict) -> dict:
    """This project's rollout with sampler dpm_solver (nothing pinned, float32 trajectory), per schedule."""
    from videogrpo.grpo import rollout

    velocity = stand_in_velocity(data)
    model = SimpleNamespace(
        pins_first_frame=False,
        trajectory_dtype=torch.float32,
        velocity=lambda transformer, x, sigma, embeds, guidance, condition=None: velocity(x, sigma),
    )
    out = {}
    for name in SCHEDULES:
        rows = data["noise"].shape[0]
        trajectory = rollout.rollout(
            model, None, None, None, data["noise"].clone(), data[name], "dpm_solver", torch.zeros(rows), None
        )
        out[name] = trajectory.latents
    return out


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per schedule's states."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    return run_module_comparison(__doc__, "DiffusionNFT", argv, SOLVER_FILE, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
