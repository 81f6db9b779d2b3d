"""A second Ctrl-C while Snakemake waits for its stopped jobs is not turned into Snakemake's own tracebacks.

On Ctrl-C, Snakemake 9.27.1 prints `Terminating processes on user request` and waits for its running local jobs
to end (`JobScheduler.schedule` calls `Executor.cancel`, which joins the threads that run the jobs); each job got
the same SIGINT from the terminal and stops (training: `interrupted; complete checkpoints are kept, rerun to
resume`). A second Ctrl-C during that wait raises KeyboardInterrupt out of the join, past Snakemake's own handling,
and its clean-up then tries to close the event loop of a thread that still runs a job: the run ends in chained
tracebacks (`KeyboardInterrupt`, `This event loop is already running`, `Cannot close a running event loop`) and
without Snakemake's account of the stopped job. `install` makes the driver ignore SIGINT while it waits (the jobs
still receive every Ctrl-C from the terminal, so a second one reaches them as before); once they have ended it
handles SIGINT again. Without the Snakemake internals it relies on, Snakemake's behaviour stays.
"""

from __future__ import annotations

import signal
import threading

from videogrpo.pipeline import snakemake_patch


def install() -> None:
    if (found := snakemake_patch.originals("snakemake.executors.local", "Executor", "cancel")) is None:
        return
    executor, cancel = found

    def cancel_ignoring_sigint(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return cancel(self, *args, **kwargs)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return cancel(self, *args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)

    snakemake_patch.replace(executor, cancel=cancel_ignoring_sigint)
