"""Progress of long work: a live rich bar on a terminal, plain lines in logs (Snakemake writes logs to files).

Both show what is done of the total (bytes or items, and files where counted), the rate and the ETA.
"""

from __future__ import annotations

import sys
import threading
import time


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """Plain: prints `label: done/total (pct), N files, rate, ETA` at most every `interval` seconds and once at
    the end. On a terminal (unless `plain`), a rich progress bar with the same figures instead.

    `update` may be called from several threads.
    """

    def __init__(
        self,
        label: str,
        total: float | None = None,
        unit: str = "",
        interval: float = 5.0,
        stream=None,
        plain: bool | None = None,
    ):
        self.label, self.total, self.unit, self.interval = label, total, unit, interval
        self.stream = stream or sys.stderr
        self.done = 0.0
        self.files = 0
        self._lock = threading.Lock()
        self._start = self._last = time.monotonic()
        self._rich = None
        if plain is None:
            plain = not getattr(self.stream, "isatty", lambda: False)()
        if not plain:
            self._start_rich()

    def _start_rich(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as RichProgress

        amount = (DownloadColumn(), TransferSpeedColumn()) if self.unit == "B" else (MofNCompleteColumn(),)
        self._rich = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            *amount,
            TextColumn("{task.fields[files]}"),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
            transient=False,
        )
        self._task = self._rich.add_task(self.label, total=self.total, files="")
        self._rich.start()

    def _fmt(self, value: float) -> str:
        if self.unit == "B":
            return human_bytes(value)
        return f"{int(value)}{(' ' + self.unit) if self.unit else ''}"

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.label}: {self._fmt(self.done)}"
        if self.total:
            text += f"/{self._fmt(self.total)} ({100 * self.done / self.total:.0f}%)"
        if self.files:
            text += f", {self.files} files"
        text += f", {self._fmt(rate)}/s" if self.unit == "B" else f", {rate:.2f}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {_duration((self.total - self.done) / rate)}"
        return text + f", elapsed {_duration(elapsed)}"

    def update(self, amount: float = 1, files: int = 0) -> None:
        with self._lock:
            self.done += amount
            self.files += files
            if self._rich is not None:
                self._rich.update(self._task, completed=self.done, files=f"{self.files} files" if self.files else "")
                return
            now = time.monotonic()
            if now - self._last < self.interval:
                return
            self._last = now
        print(self.line(), file=self.stream, flush=True)

    def set(self, done: float, files: int = 0) -> None:
        """Set the totals so far (for counts kept elsewhere, such as in other processes)."""
        self.update(done - self.done, files - self.files)

    def finish(self) -> None:
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done)
            self._rich.stop()
            self._rich = None
            return
        print(self.line(), file=self.stream, flush=True)


def human_bytes(value: float) -> str:
    """A byte count in the unit that shows it (binary steps): 512 B, 3.4 KB, 1.2 GB, never "0.0 GB"."""
    for suffix in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or suffix == "TB":
            return f"{value:.1f} {suffix}" if suffix != "B" else f"{int(value)} B"
        value /= 1024
    raise AssertionError("unreachable")
