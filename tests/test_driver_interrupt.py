"""A second Ctrl-C while Snakemake waits for the jobs it stopped is ignored by the driver (pipeline/
driver_interrupt.py). The run itself: tests/test_workflow_reruns.py (Ctrl-C during a forced training)."""

from __future__ import annotations

import os
import signal
import threading

from videogrpo.pipeline import driver_interrupt


def test_the_local_executor_waits_for_its_stopped_jobs_with_sigint_ignored_then_handles_it_again(monkeypatch):
    """Snakemake's own LocalExecutor.cancel, wrapped: a SIGINT while it waits changes nothing, and SIGINT is
    handled as before once it returns (or raises); from another thread it is Snakemake's as it was."""
    from snakemake.executors.local import Executor

    seen = []

    def cancel(self):
        seen.append(signal.getsignal(signal.SIGINT))
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the running jobs stop

    monkeypatch.setattr(Executor, "cancel", cancel)
    driver_interrupt.install()
    driver_interrupt.install()  # once only
    before = signal.getsignal(signal.SIGINT)
    Executor.cancel(object())
    assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is before

    def failing(self):
        raise RuntimeError("the pool")

    monkeypatch.setattr(Executor, "cancel", failing)
    driver_interrupt.install()
    try:
        Executor.cancel(object())
    except RuntimeError:
        pass
    assert signal.getsignal(signal.SIGINT) is before

    monkeypatch.setattr(Executor, "cancel", lambda self: seen.append(signal.getsignal(signal.SIGINT)))
    driver_interrupt.install()
    thread = threading.Thread(target=Executor.cancel, args=(object(),))
    thread.start()
    thread.join()
    assert seen[-1] is before
