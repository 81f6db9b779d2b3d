"""This project's DPM-Solver tail after an SDE window (grpo.sde_window_tail dpm_solver) against MixGRPO-Flash's own
sampling loop (Tencent-Hunyuan/MixGRPO, fastvideo/utils/sampling_utils.py's `run_sample_step`, README.md beside this
file).

    python tools/algo_diff/mixgrpo_tail.py MIXGRPO [--commit C] [--store FILE]

MIXGRPO: a checkout of MixGRPO, its git directory (a clone or bare mirror), or a plain copy of its tree. Their file is
loaded from there by path (it needs torch, diffusers and tqdm) and their loop is run as their MixGRPO-Flash scripts
set it (`post` strategy, DPM-Solver++ of order 2, midpoint, Flow-GRPO's step in the window, 25 steps, shift 3; a
compress ratio of 0.4 for Flash, 0.2 for Flash*) over a stand-in transformer: a fixed random map of the latent's
channels scaled by the timestep their loop hands it. For every window their progressive schedule takes (size 4 over
steps 0 .. 22, cut at 23) it compares, against this project's `rollout.rollout` with the same stand-in and window:
- the noise levels their loop takes (the steps up to the window's end, then the re-spaced tail) against ours
  (`samplers.sigma_schedule` up to the window's end, then `sde_window.tail`);
- the final latent, which is what the reward scores.
The window's steps run at noise level 0 on both sides (their Flow-GRPO step and this project's DanceGRPO step both
become the Euler step there), so the whole path is deterministic: the steps before and in the window, the solver's
history they leave, and the tail. Their window's SDE itself is compared by flow_grpo_steps.py.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from checkout import arguments, load_module, print_rows, relative_differences, store

SAMPLING_FILE = "fastvideo/utils/sampling_utils.py"
STEPS, SHIFT, SIZE, RANGE_END = 25, 3.0, 4, 23
RATIOS = {"flash": 0.4, "flash*": 0.2}
SHAPE = (2, 4, 1, 6, 6)  # [B, C, F, h, w]; their loop takes any shape
TOLERANCE = 2e-6
"""Largest relative difference taken as round-off: their schedule is float32 (ours float64) and each of up to 25
steps compounds it."""


def windows() -> list[tuple[int, int]]:
    """Every window their progressive schedule takes over a sweep: starts 0 .. 23, the window cut at 23 (the empty
    one at 23 left out: their loop fails on it, docs/fidelity.md)."""
    return [(start, min(start + SIZE, RANGE_END)) for start in range(RANGE_END)]


def inputs() -> dict:
    """The starting noise and the stand-in's channel map (seeded: the same on every run)."""
    generator = torch.Generator().manual_seed(1234)
    return {
        "noise": torch.randn(SHAPE, generator=generator),
        "channels": torch.randn(SHAPE[1], SHAPE[1], generator=generator) / SHAPE[1] ** 0.5,
    }


def stand_in_velocity(x: torch.Tensor, t: float, channels: torch.Tensor) -> torch.Tensor:
    """The stand-in transformer: tanh of a channel map of x, scaled by (1 + t) (t: the timestep in [0, 1])."""
    return torch.tanh(torch.einsum("oc,bc...->bo...", channels, x.float())) * (1 + t)


def their_timestep(sigma: float) -> float:
    """The timestep their loop hands the transformer for a noise level: int(sigma x 1000) / 1000 of a float32 sigma
    (the stand-in sees it the same way on both sides, so that a float64 sigma just under a thousandth does not round
    down where their float32 one does not)."""
    return int(torch.tensor(sigma, dtype=torch.float32) * 1000) / 1000


def load_sampling(source: Path, commit: str):
    """Their sampling_utils module, loaded by path from the checkout; and the commit."""
    return load_module(source, commit, SAMPLING_FILE, "mixgrpo_sampling_utils")


class StandIn(torch.nn.Module):
    """What their loop calls as the Flux transformer: it reads the latent and the timestep only."""

    def __init__(self, channels: torch.Tensor):
        super().__init__()
        self.channels = channels

    def forward(self, hidden_states, timestep, **_):
        return (stand_in_velocity(hidden_states, float(timestep[0]), self.channels),)


def their_samples(module, given: dict) -> dict:
    """Their final latent and noise-level schedule for every window and ratio."""
    found, seen, original = {}, {}, module.dpm_step

    def recording(*args, **kwargs):  # the schedule their loop builds, as it hands it to their solver step
        seen["sigmas"] = kwargs["sigmas"]
        return original(*args, **kwargs)

    module.dpm_step = recording
    try:
        for name, ratio in RATIOS.items():
            args = SimpleNamespace(
                dpm_algorithm_type="dpmsolver++",
                dpm_apply_strategy="post",
                sample_strategy="progressive",
                dpm_post_compress_ratio=ratio,
                dpm_solver_order=2,
                dpm_solver_type="midpoint",
                shift=SHIFT,
                flow_grpo_sampling=True,
                eta=0.0,
                drop_last_sample=False,
            )
            schedule = module.sd3_time_shift(SHIFT, torch.linspace(1, 0, STEPS + 1))  # as their train_grpo_flux.py
            for start, end in windows():
                seen.clear()
                z, *_ = module.run_sample_step(
                    args,
                    given["noise"].clone(),
                    range(STEPS),
                    schedule,
                    StandIn(given["channels"]),
                    torch.zeros(SHAPE[0], 3, 8),  # the text embeddings: their loop reads the batch size from them
                    None,
                    torch.zeros(1, 3),
                    None,
                    True,
                    [not start <= i < end for i in range(STEPS)],  # their `determistic`: True outside the window
                )
                # A tail of one noise level takes no solver step: their schedule then stops at the window's end.
                sigmas = seen.get("sigmas", schedule[: end + 1])
                found[f"{name} {start}-{end}"] = {"final": z.float(), "sigmas": sigmas.double()}
    finally:
        module.dpm_step = original
    return found


def our_samples(given: dict) -> dict:
    """This project's final latent and schedule (`rollout.rollout` with the dpm_solver tail) per window and ratio."""
    from videogrpo.grpo import rollout, samplers, sde_window

    model = SimpleNamespace(
        pins_first_frame=False,
        trajectory_dtype=torch.float32,  # their loop keeps its latents in float32
        velocity=lambda transformer, x, sigma, embeds, scale, condition=None: stand_in_velocity(
            x, their_timestep(sigma), given["channels"]
        ),
    )
    found = {}
    sigmas = samplers.sigma_schedule(STEPS, SHIFT)
    for name, ratio in RATIOS.items():
        g = SimpleNamespace(sampling_steps=STEPS, sde_window_tail="dpm_solver", sde_window_tail_ratio=ratio)
        for start, end in windows():
            tail = sde_window.tail(g, SHIFT, (start, end))
            trajectory = rollout.rollout(
                model,
                None,
                None,
                None,
                given["noise"].clone(),
                sigmas,
                "dancegrpo",
                torch.zeros(SHAPE[0]),
                lambda i: torch.zeros(SHAPE),
                window=(start, end),
                tail=tail,
            )
            schedule = sigmas[: end + 1] if tail is None else torch.cat([sigmas[:end], tail])
            found[f"{name} {start}-{end}"] = {"final": trajectory.latents[:, -1], "sigmas": schedule}
    return found


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    rows = []
    for case, mine in ours.items():
        if len(theirs[case]["sigmas"]) != len(mine["sigmas"]):
            rows.append((f"{case} sigmas", float("inf"), False))
            continue
        found = relative_differences(theirs[case], mine, TOLERANCE)
        rows += [(f"{case} {name}", worst, ok) for name, worst, ok in found]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "MixGRPO", argv)
    try:
        module, commit = load_sampling(args.checkout.resolve(), args.commit)
    except (OSError, ImportError) as err:
        print(f"mixgrpo_tail: could not load {SAMPLING_FILE} from {args.checkout}: {err}", file=sys.stderr)
        return 2
    given = inputs()
    theirs = their_samples(module, given)
    rows = compare(theirs, our_samples(given))
    cases = f"{len(windows())} windows x {len(RATIOS)} ratios"
    print(f"MixGRPO at {commit}: {SAMPLING_FILE}, `post` DPM-Solver++ 2M tail, {cases}")
    ok = print_rows([r for r in rows if not r[2]][:10] or [max(rows, key=lambda r: r[1])])
    print(f"  {sum(r[2] for r in rows)} of {len(rows)} within {TOLERANCE:g}  {'PASS' if ok else 'FAIL'}")
    store(args.store, {"commit": commit, "inputs": given, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
