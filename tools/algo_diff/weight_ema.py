"""This project's moving average of the trained weights (train.ema_decay, _every, _repeats) against its authors'
own EMA class driven as their training loops drive it (README.md beside this file).

    python tools/algo_diff/weight_ema.py FLOW_GRPO [--commit C] [--store FILE]

FLOW_GRPO: a checkout of yifan123/flow_grpo (or NVlabs/DiffusionNFT, which ships the same class), its git directory,
or a plain copy of its tree. The tool loads their `flow_grpo/ema.py` by path and drives its `EMAModuleWrapper` over
40 optimizer updates of a few weight tensors (each update a fixed seeded change), with the calls of each loop:
- Flow-GRPO-Fast and GRPO-Guard (scripts/train_sd3_fast.py, train_sd3_GRPO_Guard.py): decay 0.9, interval 8, and
  `ema.step(params, global_step)` after every micro-batch of an update, global_step counting the updates done (2
  micro-batches an update in Flow-GRPO-Fast's config, 4 in GRPO-Guard's);
- DiffusionNFT (scripts/train_nft_sd3.py): decay 0.9, interval 1, one `ema.step` after each update.
Beside it, this project's `weight_copy.step_ema` with the presets' train.ema_* values around the same updates.
Compared: the average after every update, for each loop.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from checkout import relative_differences, run_module_comparison

EMA_FILE = "flow_grpo/ema.py"
UPDATES = 40
LOOPS = {"flow_grpo_fast": (0.9, 8, 2), "grpo_guard": (0.9, 8, 4), "diffusion_nft": (0.9, 1, 1)}
"""Per loop: the decay, their update_step_interval and the calls an update makes (micro-batches), which are this
project's train.ema_decay, ema_every and ema_repeats."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = f"{UPDATES} updates, loops {sorted(LOOPS)}"
"""What a run compares, as it prints it."""


def inputs() -> dict:
    """The initial weights (two tensors) and each update's change to them, seeded."""
    generator = torch.Generator().manual_seed(0)
    shapes = ((3, 4), (5,))
    return {
        "initial": [torch.randn(*s, generator=generator) for s in shapes],
        "changes": [[0.1 * torch.randn(*s, generator=generator) for s in shapes] for _ in range(UPDATES)],
    }


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def authors_side(module, data: dict) -> dict:
    """Their EMAModuleWrapper, called as each loop calls it: the average after every update."""
    out = {}
    for name, (decay, interval, calls) in LOOPS.items():
        params = [torch.nn.Parameter(t.clone()) for t in data["initial"]]
        ema = module.EMAModuleWrapper(params, decay=decay, update_step_interval=interval, device=torch.device("cpu"))
        global_step, after = 0, []
        for change in data["changes"]:
            for call in range(calls):
                if call == calls - 1:  # the update's optimizer step comes with its last micro-batch
                    with torch.no_grad():
                        for p, c in zip(params, change):
                            p.add_(c)
                    global_step += 1
                ema.step(params, global_step)
            after.append(_flat(ema.ema_parameters))
        out[name] = torch.stack(after)
    return out


def project_side(data: dict) -> dict:
    """This project's average (grpo.weight_copy) with each loop's train.ema_* values: after every update."""
    from videogrpo.grpo import weight_copy

    out = {}
    for name, (decay, every, repeats) in LOOPS.items():
        t = SimpleNamespace(ema_decay=decay, ema_every=every, ema_repeats=repeats)
        params = [torch.nn.Parameter(w.clone()) for w in data["initial"]]
        ema, after = weight_copy.WeightCopy(params, []), []
        for update, change in enumerate(data["changes"], start=1):
            weight_copy.step_ema(ema, update, t, after=False)
            with torch.no_grad():
                for p, c in zip(params, change):
                    p.add_(c)
            weight_copy.step_ema(ema, update, t, after=True)
            after.append(_flat(ema.copies))
        out[name] = torch.stack(after)
    return out


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per loop."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    return run_module_comparison(__doc__, "flow_grpo", argv, EMA_FILE, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
