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

DiffusionNFT (grpo.algorithm nft, docs/options.md#diffusionnft) trains noise levels rather than transitions: its
subset is `nft_count` of all T sampling sigmas, drawn afresh per update and shared by every row (so an A14B's rows
all route to the same expert at each step).

Torch-free: the planner and the FLOP count read `trained_steps` too.

May import: `config` and the core modules.
"""

from __future__ import annotations

import numpy as np

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
        from videogrpo.grpo.rollout import counter_seed

        start = lo + int(np.random.default_rng(counter_seed(seed, WINDOW_TAG, batch)).integers(starts))
    else:  # MixGRPO's schedule: starts lo, lo + stride, ... up to hi, the window cut at hi, then back to lo
        positions = (hi - lo) // g.sde_window_stride + 1
        start = lo + (batch // g.sde_window_shift_every) % positions * g.sde_window_stride
        return start, min(start + size, hi)
    return start, start + size


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
    return (
        f"SDE window: {g.sde_window_size} of {g.sampling_steps} denoising steps sampled with {g.sampler} and "
        f"trained, {where}; the other steps take the Euler ODE"
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
    seeded subset (rollout.trained_timesteps); DiffusionNFT: the noise levels it trains, a seeded subset of all T."""
    if g.algorithm == "nft":
        from videogrpo.grpo.rollout import counter_seed

        order = np.random.default_rng(counter_seed(seed, NFT_TAG, update)).permutation(g.sampling_steps)
        return sorted(int(i) for i in order[: nft_count(g.sampling_steps, g.timestep_fraction)])
    if (steps := window(g, seed, batch)) is not None:
        return list(range(*steps))
    from videogrpo.grpo.rollout import trained_timesteps

    return trained_timesteps(g.sampling_steps, g.timestep_fraction, seed, update)
