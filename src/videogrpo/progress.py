"""Progress lines for long work: plain text on stderr, so Snakemake logs and terminals both read well."""

from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """Prints `label: done/total (pct) rate, ETA` at most every `interval` seconds, and once at the end."""

    def __init__(self, label: str, total: float | None = None, unit: str = "", interval: float = 5.0, stream=None):
        self.label, self.total, self.unit, self.interval = label, total, unit, interval
        self.stream = stream or sys.stderr
        self.done = 0.0
        self._start = self._last = time.monotonic()

    def _fmt(self, value: float) -> str:
        if self.unit == "B":
            for suffix in ("B", "KB", "MB", "GB", "TB"):
                if value < 1024 or suffix == "TB":
                    return f"{value:.1f} {suffix}" if suffix != "B" else f"{int(value)} B"
                value /= 1024
        return f"{int(value)}{(' ' + self.unit) if self.unit else ''}"

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.label}: {self._fmt(self.done)}"
        if self.total:
            text += f"/{self._fmt(self.total)} ({100 * self.done / self.total:.0f}%)"
        text += f", {self._fmt(rate)}/s" if self.unit == "B" else f", {rate:.2f}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {_duration((self.total - self.done) / rate)}"
        return text + f", elapsed {_duration(elapsed)}"

    def update(self, amount: float = 1) -> None:
        self.done += amount
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            print(self.line(), file=self.stream, flush=True)

    def finish(self) -> None:
        print(self.line(), file=self.stream, flush=True)
