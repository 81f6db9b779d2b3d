"""What a memory plan is made of: its terms (bytes a rank holds, in which phases of an update, and why), the phases,
and how the plan prints bytes. Its own module so that the plan's parts (memory_plan, refiner_memory) share it
without importing each other.

May import: the core modules.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
ROLLOUT, REPLAY, STEP = "rollout", "replay", "optimizer step"
REPLAY_WORKING_SET = "replay working set"
"""The alternative group of the replays' working sets: the generator's, then each prompt refiner's, one at a time."""


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    phases: tuple[str, ...]
    detail: str
    alternative: str = ""
    """Terms of one phase with the same non-empty `alternative` (the group's name) are never held at once: the phase
    counts the largest (the rollout's working set is freed before its videos are decoded)."""


def gib(value: float) -> str:
    """Bytes as the plan prints them: GiB with two decimals from 0.1 GiB up, else the unit that shows them."""
    from videogrpo.progress import human_bytes

    return f"{value / GIB:.2f} GiB" if value >= GIB / 10 else human_bytes(value)
