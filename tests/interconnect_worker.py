"""A stand-in for the trainer's torchrun worker, for tests: `python -m interconnect_worker <the worker's arguments>`.

Each rank writes the interconnect variables of its environment to `<--run-dir>/interconnect-rank<r>.json`; rank 0
then writes what the train stage reads back (one metrics line, the final directory), so the stage finishes and writes
its manifest without training anything.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from videogrpo.provenance import interconnect

parser = argparse.ArgumentParser()
for name in ("--run-dir", "--final", "--metrics"):
    parser.add_argument(name, type=Path, required=True)
args, _ = parser.parse_known_args()
rank = int(os.environ["RANK"])
args.run_dir.mkdir(parents=True, exist_ok=True)
(args.run_dir / f"interconnect-rank{rank}.json").write_text(json.dumps(interconnect.recorded(os.environ)))
if rank == 0:
    args.final.mkdir(parents=True, exist_ok=True)
    (args.final / "stand-in").write_text("no weights: the interconnect test trains nothing\n")
    # What every export holds beside its weights (grpo/export.py), which the stage reads back.
    (args.final / "training_state.json").write_text(json.dumps({"run_id": "r", "updates": 1, "layout": {}}) + "\n")
    args.metrics.parent.mkdir(parents=True, exist_ok=True)
    args.metrics.write_text(json.dumps({"step": 1}) + "\n")
