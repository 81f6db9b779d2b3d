"""This project's sliding SDE window (grpo.sde_window_mode sliding) against MixGRPO's own window schedule
(Tencent-Hunyuan/MixGRPO, fastvideo/utils/grpo_states.py's GRPOTrainingStates, README.md beside this file).

    python tools/algo_diff/mixgrpo_window.py MIXGRPO [--commit C] [--store FILE]

MIXGRPO: a checkout of MixGRPO, its git directory (a clone or bare mirror), or a plain copy of its tree. Their class
is loaded from there by path (it needs numpy only) and driven as their training script drives it, with the settings
of their MixGRPO script (scripts/finetune/finetune_flux_grpo_MixGRPO.sh: 25 sampling steps, `progressive` with an
overlap step of 1, 25 iterations per position, a window of 4, roll back; the range their script gives it, steps
0 .. sampling_steps - 2), for 700 iterations (more than one full sweep): the steps each iteration trains. This
project's `sde_window.window` with the same size, range [0, 23), stride 1 and shift every 25 gives a window per data
batch (their training iteration is this project's batch: the same in synchronous runs). Every iteration must give
the same steps, the end of a sweep included, where their window is cut at the range's end down to no step at all
before the sweep starts over.

--store FILE writes their windows (what tests/test_algo_diff.py compares against without the checkout). Exit status:
0 when every window agrees, 1 when one does not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from checkout import arguments, load_module, store

STATES_FILE = "fastvideo/utils/grpo_states.py"
SAMPLING_STEPS, SIZE, OVERLAP_STEP, ITERS_PER_GROUP, ITERATIONS = 25, 4, 1, 25, 700


def their_windows(source: Path, commit: str) -> tuple[list[list[int]], str]:
    """The steps their GRPOTrainingStates trains at each of ITERATIONS iterations, as their training loop asks."""
    module, where = load_module(source, commit, STATES_FILE, "mixgrpo_grpo_states")
    states = module.GRPOTrainingStates(
        iters_per_group=ITERS_PER_GROUP,
        group_size=SIZE,
        max_timesteps=SAMPLING_STEPS - 2,  # as their train_grpo_flux.py
        cur_timestep=0,
        cur_iter_in_group=0,
        sample_strategy="progressive",
        prog_overlap=True,
        prog_overlap_step=OVERLAP_STEP,
        max_iters_per_group=10,
        min_iters_per_group=1,
        roll_back=True,
    )
    windows = []
    for _ in range(ITERATIONS):
        windows.append([int(t) for t in states.get_current_timesteps()])
        states.update_iteration()
    return windows, where


def our_windows() -> list[list[int]]:
    """This project's sliding window per data batch, at the same settings."""
    from videogrpo.grpo import sde_window

    g = SimpleNamespace(
        sampling_steps=SAMPLING_STEPS,
        sde_window_size=SIZE,
        sde_window_range=[0, SAMPLING_STEPS - 2],
        sde_window_mode="sliding",
        sde_window_stride=OVERLAP_STEP,
        sde_window_shift_every=ITERS_PER_GROUP,
    )
    return [list(range(*sde_window.window(g, 0, batch))) for batch in range(ITERATIONS)]


def compare(theirs: list[list[int]], ours: list[list[int]]) -> list[tuple[int, list[int], list[int]]]:
    """Every iteration where the two windows differ: (iteration, theirs, ours)."""
    return [(i, t, o) for i, (t, o) in enumerate(zip(theirs, ours, strict=True)) if t != o]


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "MixGRPO", argv)
    try:
        theirs, commit = their_windows(args.checkout.resolve(), args.commit)
    except OSError as err:
        print(f"mixgrpo_window: could not load {STATES_FILE} from {args.checkout}: {err}", file=sys.stderr)
        return 2
    differ = compare(theirs, our_windows())
    cut, empty = sum(len(w) < SIZE for w in theirs), sum(not w for w in theirs)
    print(f"MixGRPO at {commit}: {STATES_FILE}, {ITERATIONS} iterations, window {SIZE} of {SAMPLING_STEPS} steps")
    verdict = "PASS" if not differ else "FAIL"
    print(f"  windows equal: {ITERATIONS - len(differ)} of {ITERATIONS} ({cut} cut, {empty} empty)  {verdict}")
    for i, t, o in differ[:10]:
        print(f"    iteration {i}: theirs {t}, ours {o}")
    store(args.store, {"commit": commit, "theirs": theirs})
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
