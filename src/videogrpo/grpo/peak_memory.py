"""This rank's peak allocated device memory, per phase of an update's period: what the trainer logs
(`peak_memory_bytes` and, per phase, `peak_memory_<phase>_bytes`) and what the GPU smoke benchmark compares with
the memory plan's phase totals.

CUDA keeps one peak counter; a phase boundary folds it into the phase that ends and resets it (the new peak starts
from what is allocated then), so each phase's peak is its own and the period's is their maximum. On other devices
every peak is 0.
"""

from __future__ import annotations

import torch


class PeakMemory:
    """The trainer holds one, resets it where each logged update's period starts and enters the rollout and replay
    phases as it reaches them; tests replace it."""

    def __init__(self, device: torch.device, counter=None):
        """`counter`: an object with CUDA's `max_memory_allocated(device)` and `reset_peak_memory_stats(device)`
        (default torch.cuda on a CUDA device; tests give one that counts on CPU)."""
        self.device = device
        self.counter = counter if counter is not None else (torch.cuda if device.type == "cuda" else None)
        self.phases: dict[str, int] = {}
        self.current: str | None = None

    def _running(self) -> int:
        return 0 if self.counter is None else self.counter.max_memory_allocated(self.device)

    def _read_and_reset(self) -> int:
        value = self._running()
        if self.counter is not None:
            self.counter.reset_peak_memory_stats(self.device)
        return value

    def reset(self) -> None:
        self._read_and_reset()
        self.phases, self.current = {}, None

    def enter(self, phase: str) -> None:
        """The phase that ends gets the peak since it began; `phase` starts counting from what is allocated now."""
        value = self._read_and_reset()
        if self.current is not None:
            self.phases[self.current] = max(self.phases.get(self.current, 0), value)
        self.current = phase

    def phase_peaks(self) -> dict[str, int]:
        """Each phase's peak in this period so far, the running one included (its counter is not reset)."""
        peaks = dict(self.phases)
        if self.current is not None:
            peaks[self.current] = max(peaks.get(self.current, 0), self._running())
        return peaks

    def peak(self) -> int:
        return max([self._running(), *self.phases.values()])
