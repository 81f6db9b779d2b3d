"""Every random draw of training and evaluation, keyed by what it is for (seed, step, prompt, member, denoising
step, a tag per kind of draw), never by who draws it or in what order: a stateless generator per key. That is what
lets another topology, a resume or delayed replay draw exactly what one uninterrupted run on the release topology
draws.

Torch-free to import (the planner and the FLOP count read the seeded step subsets): torch only where a tensor is
drawn.

May import: the core modules.
"""

from __future__ import annotations

import numpy as np


def counter_seed(*key: int) -> int:
    """A 63-bit seed from integer counters (NumPy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def seeded_normal(shape: tuple[int, ...], device, *key: int):
    """A float32 standard normal tensor of `shape` on `device`, from the generator of `key`."""
    import torch

    generator = torch.Generator(device=device).manual_seed(counter_seed(*key))
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)


def keyed_uniforms(count: int, *key: int) -> list[float]:
    """`count` uniforms in [0, 1) from the generator of `key` (a prompt refiner's token draws)."""
    return [float(u) for u in np.random.default_rng(counter_seed(*key)).random(count)]


def seeded_uniform(lo: float, hi: float, *key: int) -> float:
    return float(np.random.default_rng(counter_seed(*key)).uniform(lo, hi))
