"""The learning rate of every optimizer update (docs/reference-system.md#grpo): linear warm-up from 0, then cosine
decay (the reference), or the peak held (train.lr_schedule constant: the published algorithms' authors).

One pure function, read by the trainer before each update: the rate depends only on the update's
index and the run's update count (from `replay.plan`), so a resumed run continues the same curve
without any scheduler state in the checkpoint.
"""

from __future__ import annotations

import math


def learning_rate(update_index: int, warmup: int, total: int, peak: float, schedule: str = "cosine") -> float:
    """Rate of the update with 0-based index k of `total`: peak k / warmup while k < warmup, then
    peak (1 + cos(pi (k - warmup) / (total - warmup))) / 2 (the reference's denominators floor at 1), or peak
    (`constant`)."""
    if update_index < warmup:
        return peak * update_index / max(warmup, 1)
    if schedule == "constant":
        return peak
    progress = (update_index - warmup) / max(total - warmup, 1)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
