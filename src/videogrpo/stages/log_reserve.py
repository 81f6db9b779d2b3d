"""Room on a full disk for a stage's last line: the error that names the file and the fix.

A rule sends a stage's output to its log (`> {log} 2>&1`), which lives on the file system of `results`. When that
file system fills up, the log is cut short wherever the disk ran out (often inside some library's traceback), and
the message that says what filled and what to do never reaches it, though the log is what Snakemake shows of the
failed job. So a stage whose stderr is a file keeps a small reserve file beside it while it runs, and deletes it
to make room just before it prints its error; the training rule's log, which its output reaches through a pipe so
that it also shows on the terminal, gets the same from log_tee.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

RESERVE_BYTES = 64 * 1024  # several lines of message, and the file system's block rounding


def _stderr_file() -> Path | None:
    """The regular file stderr writes to (the rule's log), or None (a terminal, a pipe, another system)."""
    try:
        target = os.readlink(f"/proc/self/fd/{2}")
    except OSError:
        return None
    return Path(target) if os.path.isfile(target) else None


@contextmanager
def reserve_beside(log: Path | None) -> Iterator[Callable[[], None]]:
    """While the body runs, a reserve file beside `log` (none for None); yields the function that deletes it (call
    it before writing the last lines). Deleted on the way out in any case; never a reason to fail."""
    reserve = log.parent / f".{log.name}.reserve" if log else None
    if reserve is not None:
        try:
            with open(reserve, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)  # written, not sparse: the blocks are really taken
        except OSError:  # already full, or not writable: nothing to keep
            reserve.unlink(missing_ok=True)
            reserve = None

    def make_room() -> None:
        if reserve is not None:
            reserve.unlink(missing_ok=True)

    try:
        yield make_room
    finally:
        make_room()


def room_for_the_last_line():
    """reserve_beside the log this process's stderr writes to, if it writes to a file (`> {log} 2>&1`)."""
    return reserve_beside(_stderr_file())
