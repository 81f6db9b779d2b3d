"""The trainer's torchrun worker with probes, for tests: `python -m probe_worker <the worker's arguments>`.

Each rank writes `$PROBE_OUT/probe-rank<r>.json` when it ends:
- `forwards`: what every forward of the trainable transformer received (after FSDP's own pre-forward
  hooks, so what its forward body computes with): rollout (no grad) or replay, the dtypes of the
  timestep and of the hidden states, and the distinct timestep values;
- `resets`: how often the trainer reset the peak-memory counters. This rank's peak reads
  1000 x (rank + 1) + resets so far, so the logged value shows both the reduction over ranks and
  the reset per update.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from videogrpo.grpo import trainer, worker

RANK = int(os.environ.get("RANK", "0"))
FORWARDS: list[dict] = []
RESETS = [0]


class CountingMemory:
    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        RESETS[0] += 1

    def enter(self, phase: str) -> None:
        pass

    def phase_peaks(self) -> dict[str, int]:
        return {}

    def peak(self) -> int:
        return 1000 * (RANK + 1) + RESETS[0]


def record(module, args, kwargs):
    timestep, hidden = kwargs["timestep"], kwargs["hidden_states"]
    FORWARDS.append(
        {
            "phase": "replay" if torch.is_grad_enabled() else "rollout",
            "timestep_dtype": str(timestep.dtype).removeprefix("torch."),
            "hidden_dtype": str(hidden.dtype).removeprefix("torch."),
            "timesteps": sorted({float(v) for v in timestep.detach().flatten().tolist()}),
        }
    )


_init = trainer.Trainer.__init__


def probed_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.experts.policy.register_forward_pre_hook(record, with_kwargs=True)  # after FSDP's (prepended) hooks


def main() -> int:
    trainer.PeakMemory = CountingMemory
    trainer.Trainer.__init__ = probed_init
    try:
        return worker.main()
    finally:
        out = Path(os.environ["PROBE_OUT"]) / f"probe-rank{RANK}.json"
        out.write_text(json.dumps({"forwards": FORWARDS, "resets": RESETS[0]}))


if __name__ == "__main__":
    sys.exit(main())
