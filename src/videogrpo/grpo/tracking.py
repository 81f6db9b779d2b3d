"""Where training metrics go: JSON lines (kept beside the checkpoints), W&B, and a progress line."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from videogrpo import atomic


class Tracker:
    """Rank 0 only: call `record` once per optimizer update."""

    def __init__(
        self,
        metrics_file: Path,
        total_updates: int,
        wandb_mode: str,
        project: str,
        run_id: str,
        run_dir: Path,
        config: dict,
        enabled: bool,
    ):
        self.metrics_file, self.total, self.enabled = metrics_file, total_updates, enabled
        self.wandb = None
        self._started = time.monotonic()
        self._first: int | None = None
        if enabled and wandb_mode != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.wandb = wandb.init(
                project=project,
                name=run_id,
                id=run_id,
                dir=str(run_dir),
                mode=wandb_mode,
                resume="allow",
                config=config,
            )

    def trim(self, upto: int) -> None:
        """Keep only the lines of updates a resumed run will not redo."""
        if not self.enabled or not self.metrics_file.exists():
            return
        kept = [
            line for line in self.metrics_file.read_text().splitlines() if line and json.loads(line)["step"] <= upto
        ]
        atomic.write_text(self.metrics_file, "".join(line + "\n" for line in kept))

    def record(self, metrics: dict) -> None:
        if not self.enabled:
            return
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(metrics, sort_keys=True) + "\n")
        if self.wandb is not None:
            flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            flat.update({f"reward/{t}": v for t, v in metrics.get("reward_per_task", {}).items()})
            self.wandb.log(flat, step=metrics["step"])
        if self._first is None:
            self._first = metrics["step"] - 1
        done = metrics["step"] - self._first
        eta = (time.monotonic() - self._started) / max(done, 1) * (self.total - metrics["step"])
        speed = ""
        if metrics.get("time_tokens_per_s") is not None:
            speed = f" | {metrics['time_tokens_per_s']:.0f} tokens/s"
        if metrics.get("time_mfu") is not None:
            speed += f" | MFU {100 * metrics['time_mfu']:.1f} %"
        log(
            f"step {metrics['step']}/{self.total} | reward {metrics['reward_mean']:.4f} ± {metrics['reward_std']:.4f}"
            f" | loss {metrics['policy_loss']:+.5f} | ratio {metrics['ppo_ratio_mean']:.6f}"
            f" | stale {metrics['delayed_replay_staleness']:.1f} | {metrics['time_step_s']:.2f} s/update{speed}"
            f" | ETA {math.ceil(eta)} s"
        )

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)
