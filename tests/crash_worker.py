"""The trainer's torchrun worker that dies between two optimizer updates, for tests: `python -m crash_worker <the
worker's arguments>`. Rank 0 SIGKILLs itself right after optimizer update $CRASH_AFTER_UPDATE (counted from the
start of this process), as a node that fails mid-batch would; unset, it trains as the trainer's own worker.
"""

from __future__ import annotations

import os
import signal
import sys

from videogrpo.grpo import experts, worker

_step = experts.Experts.step
DONE = [0]


def crashing_step(self, lr: float, max_norm: float) -> float:
    norm = _step(self, lr, max_norm)
    DONE[0] += 1
    if str(DONE[0]) == os.environ.get("CRASH_AFTER_UPDATE") and os.environ.get("RANK", "0") == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return norm


if __name__ == "__main__":
    experts.Experts.step = crashing_step
    sys.exit(worker.main())
