"""The SDE window (grpo.sde_window_size > 0, docs/options.md#sde-window): a rollout samples with the SDE on a short
window of consecutive denoising steps and with the deterministic Euler ODE on every other step, and replay trains the
window's steps only.

Where the window sits, per data batch (every prompt and member of a batch shares it, so replay takes one window
step at a time over all rows, and the two experts of an A14B each take the window steps their noise level routes to
them):
- `random` (Flow-GRPO-Fast): a start drawn uniformly from `lo .. hi - size` of grpo.sde_window_range, keyed by the
  run's seed and the batch, so every rank, resume and delayed replay sees the same window;
- `sliding` (MixGRPO): the window starts at `lo` and moves `sde_window_stride` steps every `sde_window_shift_every`
  batches; as MixGRPO's schedule, it is cut at `hi` near the end of the range (down to no step at all when it starts
  at `hi`) and starts again at `lo` once its start would pass `hi`.

After the window the rollout takes the Euler ODE on every remaining step, or (grpo.sde_window_tail dpm_solver,
MixGRPO-Flash) DPM-Solver++ on fewer steps re-spaced from the window's end (`tail`).

DiffusionNFT (grpo.algorithm nft, docs/options.md#diffusionnft) trains noise levels rather than transitions: its
subset is `nft_count` of all T sampling sigmas, drawn afresh per update and shared by every row (so an A14B's rows
all route to the same expert at each step).

Torch-free: the planner and the FLOP count read `trained_steps` too.

May import: `grpo.draws`, `config` and the core modules.
"""

from __future__ import annotations

import numpy as np

from videogrpo.grpo.draws import counter_seed

WINDOW_TAG = 0x5DE0
"""The key slot of the window's draw (training's other draws use others)."""
NFT_TAG = 0x4E58
"""The key slot of DiffusionNFT's draw of its trained noise levels."""


def window_range(g) -> tuple[int, int]:
    """The steps [lo, hi) the window may cover (grpo.sde_window_range; null: every denoising step)."""
    return tuple(g.sde_window_range) if g.sde_window_range is not None else (0, g.sampling_steps)


def window(g, seed: int, batch: int) -> tuple[int, int] | None:
    """The denoising steps [start, end) that batch `batch` samples with the SDE and trains (`g`: the grpo section);
    None when the window is off (the reference: SDE on every step)."""
    size = g.sde_window_size
    if not size:
        return None
    lo, hi = window_range(g)
    starts = hi - size - lo + 1  # how many starts keep the window inside the range
    if g.sde_window_mode == "random":
        start = lo + int(np.random.default_rng(counter_seed(seed, WINDOW_TAG, batch)).integers(starts))
    else:  # MixGRPO's schedule: starts lo, lo + stride, ... up to hi, the window cut at hi, then back to lo
        positions = (hi - lo) // g.sde_window_stride + 1
        start = lo + (batch // g.sde_window_shift_every) % positions * g.sde_window_stride
        return start, min(start + size, hi)
    return start, start + size


def tail_points(g, end: int) -> int:
    """The DPM-Solver tail's noise levels after a window ending at `end` (grpo.sde_window_tail dpm_solver), as
    MixGRPO-Flash counts them: int(max((T - end + 1) x ratio, 1)), the window's end included."""
    return int(max((g.sampling_steps - end + 1) * g.sde_window_tail_ratio, 1))


def tail_start(g, steps: tuple[int, int] | None) -> int | None:
    """The step the DPM-Solver tail takes over at (the end of window `steps`); None with the Euler tail, without a
    window, or when the window reaches the last step."""
    if g.sde_window_tail != "dpm_solver" or steps is None or steps[1] >= g.sampling_steps:
        return None
    return steps[1]


def tail(g, shift: float, steps: tuple[int, int] | None):
    """The noise levels the rollout takes after window `steps` with the DPM-Solver (samplers.respaced_tail, float64
    torch); None where there is no tail (`tail_start`)."""
    if (start := tail_start(g, steps)) is None:
        return None
    from videogrpo.grpo.samplers import respaced_tail

    return respaced_tail(g.sampling_steps, shift, start, tail_points(g, start))


def rollout_forwards(g, steps: tuple[int, int] | None) -> int:
    """Transformer evaluations of one rollout whose window is `steps`: every denoising step, or with the DPM-Solver
    tail the steps up to the window's end and then the tail's."""
    if (start := tail_start(g, steps)) is None:
        return g.sampling_steps
    return start + tail_points(g, start) - 1


def mean_rollout_forwards(g) -> float:
    """`rollout_forwards` averaged over where the window may sit: every start of the range equally (random), every
    position of a sweep once (sliding)."""
    if not g.sde_window_size:
        return float(g.sampling_steps)
    lo, hi = window_range(g)
    if g.sde_window_mode == "random":
        ends = [start + g.sde_window_size for start in range(lo, hi - g.sde_window_size + 1)]
    else:
        starts = range(lo, lo + ((hi - lo) // g.sde_window_stride + 1) * g.sde_window_stride, g.sde_window_stride)
        ends = [min(start + g.sde_window_size, hi) for start in starts]
    return sum(rollout_forwards(g, (0, end)) for end in ends) / len(ends)


def describe(g) -> str:
    """The trainer's line for the window ("" when it is off)."""
    if not g.sde_window_size:
        return ""
    lo, hi = window_range(g)
    where = (
        f"a start drawn per batch from {lo}..{hi - g.sde_window_size}"
        if g.sde_window_mode == "random"
        else f"sliding from {lo} by {g.sde_window_stride} every {g.sde_window_shift_every} batches, cut at {hi}"
    )
    after = "the other steps take the Euler ODE"
    if g.sde_window_tail == "dpm_solver":
        after = (
            f"the steps before it take the Euler ODE, the steps after it are re-spaced to {g.sde_window_tail_ratio} "
            "of their count and taken by DPM-Solver++ (2M)"
        )
        short = next((end for end in range(1, g.sampling_steps) if tail_points(g, end) == 1), hi)
        if short < hi:  # MixGRPO-Flash's count leaves these tails one noise level: no step to 0
            after += f"; a window ending at step {short} or later leaves its sample at that noise level, above 0"
    return (
        f"SDE window: {g.sde_window_size} of {g.sampling_steps} denoising steps sampled with {g.sampler} and "
        f"trained, {where}; {after}"
    )


def fraction_count(steps: int, fraction: float) -> int:
    """The reference's count of trained steps: max(1, int((T - 1) x fraction)), int() of the float product as the
    reference computes it (100 x 0.29 keeps 28, not 29)."""
    return max(1, int((steps - 1) * fraction))


def nft_count(steps: int, fraction: float) -> int:
    """DiffusionNFT's count of trained noise levels: max(1, int(T x fraction)) of the T sampling sigmas (every one but
    the final 0), as its authors count them."""
    return max(1, int(steps * fraction))


def trained_steps(g) -> int:
    """Denoising steps replayed per update: the window's size (at most: a sliding window is cut at the end of its
    range), else the reference's fraction of the first T - 1 (DiffusionNFT: its fraction of all T)."""
    if g.algorithm == "nft":
        return nft_count(g.sampling_steps, g.timestep_fraction)
    return g.sde_window_size or fraction_count(g.sampling_steps, g.timestep_fraction)


def replayed_steps(g, seed: int, batch: int, update: int) -> list[int]:
    """The denoising steps update `update` replays of batch `batch`: the batch's SDE window, else the reference's
    seeded subset (trained_timesteps); DiffusionNFT: the noise levels it trains, a seeded subset of all T."""
    if g.algorithm == "nft":
        order = np.random.default_rng(counter_seed(seed, NFT_TAG, update)).permutation(g.sampling_steps)
        return sorted(int(i) for i in order[: nft_count(g.sampling_steps, g.timestep_fraction)])
    if (steps := window(g, seed, batch)) is not None:
        return list(range(*steps))
    return trained_timesteps(g.sampling_steps, g.timestep_fraction, seed, update)


def trained_timesteps(steps: int, fraction: float, seed: int, update: int) -> list[int]:
    """The reference's trained steps: fraction_count of the first T - 1 steps by a seeded permutation per update,
    sorted."""
    keep = fraction_count(steps, fraction)
    order = np.random.default_rng(counter_seed(seed, 0x7117, update)).permutation(steps - 1)
    return sorted(int(i) for i in order[:keep])
