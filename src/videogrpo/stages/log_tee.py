"""`python3 -m videogrpo.stages.log_tee LOG`: tee(1) for the training rule's log, which keeps the log's last lines.

Training's output goes to the terminal as it comes and to its log (`2>&1 | python3 -m videogrpo.stages.log_tee {log}`).
tee(1) stops writing a log whose file system is full, so the log Snakemake shows of the failed job ends wherever
the disk ran out, inside torchrun's report of the failure, never at the line that says what filled and what to
do. This one keeps the last lines it could not write in memory and, when its input ends, writes them after a
note of what is missing, in room it kept beside the log (log_reserve.py). Like `tee -i` it ignores Ctrl-C, which
the training handles: the lines it prints while it stops still reach the log.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path

from videogrpo.stages.log_reserve import reserve_beside

TAIL_BYTES = 16 * 1024  # the last lines kept while the log cannot take them: well inside the reserve


def tee(source: int, terminal: int, log: Path) -> int:
    """Copy `source` to `terminal` and to `log` until `source` ends; returns the bytes the log could not take
    while it ran (its last TAIL_BYTES of them written at the end, after a note)."""
    lost, tail = 0, bytearray()
    with reserve_beside(log) as make_room, open(log, "wb", buffering=0) as sink:
        while chunk := os.read(source, 65536):
            try:
                os.write(terminal, chunk)
            except OSError:  # the terminal is gone: the log still gets everything
                pass
            if lost:
                lost += len(chunk)
                tail = (tail + chunk)[-TAIL_BYTES:]
                continue
            written = 0
            try:
                while written < len(chunk):
                    written += sink.write(chunk[written:]) or 0
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                lost = len(chunk) - written
                tail = bytearray(chunk[written:])[-TAIL_BYTES:]
        if lost:
            make_room()
            note = (
                f"\n[{log}: {lost} bytes of output not written here, the file system being full; the last "
                f"{len(tail)} of them follow]\n"
            )
            try:
                sink.write(note.encode() + bytes(tail[tail.find(b"\n") + 1 :] if lost > len(tail) else tail))
            except OSError:  # not even the reserve's room: the terminal has had every line
                pass
    return lost


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: python3 -m videogrpo.stages.log_tee LOG  (standard input to standard output and LOG)",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tee(sys.stdin.fileno(), sys.stdout.fileno(), Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
