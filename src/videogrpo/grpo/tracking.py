"""Where training metrics go: JSON lines (kept beside the checkpoints), W&B and/or MLflow, and a progress line."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from videogrpo import atomic
from videogrpo.config.checks import uses_tracker
from videogrpo.config.sections import LoggingConfig
from videogrpo.grpo import mlflow_run
from videogrpo.provenance.metric_rows import VALIDATION_PREFIX, gold_kinds

VALIDATED = VALIDATION_PREFIX + "reward_mean"
VALIDATION_STEP = VALIDATION_PREFIX + "step"
"""W&B's x-axis of the validation points: the update each follows (0 before training)."""


class Tracker:
    """Rank 0 only: call `record` once per optimizer update.

    A resumed run (same run identity) continues the same W&B run (its id is the identity) and the same MLflow
    run (found by its identity tag). metrics.jsonl is trimmed to the checkpoint and holds the redone updates
    as redone. MLflow's history would hold a redone update twice, so updates the MLflow run already holds are
    not logged again: it keeps the values first logged (the same numbers, as a resume is bit-identical, but
    for the time_* ones). W&B likewise is sent only the updates and validation points its run does not hold
    (online, a resumed run's summary says which); offline each attempt is one folder of the same run id.

    W&B rows carry no explicit step: W&B drops a row logged at a step below its run's current one, and a resumed
    run's current step is one past the last row its server holds, which can be update k's row from an attempt
    that stopped during the validation after update k (finishing sent the row): the redone point at k, logged at
    step k, would be dropped. Each row is W&B's next step instead, and the charts' x-axes are logged values:
    `step` (the update) for the training metrics, `val/step` (the update a point follows) for the `val/*` ones.
    """

    def __init__(
        self,
        metrics_file: Path,
        total_updates: int,
        logging: LoggingConfig,
        run_id: str,
        run_dir: Path,
        config: dict,
        enabled: bool,
    ):
        self.metrics_file, self.total, self.enabled = metrics_file, total_updates, enabled
        self.wandb = None
        self._wandb_upto, self._wandb_validated_upto = 0, -1
        """The last update and validation point the W&B run holds (a resumed run's summary says)."""
        self._wandb_axis = {"step"}
        """The training metrics given `step` as their W&B x-axis so far."""
        self.mlflow: mlflow_run.Run | None = None
        self._mlflow_upto = 0
        self._mlflow_validated_upto = -1
        """The last validation point the MLflow run holds (-1: none; 0 is the one before training)."""
        self._last = 0
        self._started = time.monotonic()
        self._first: int | None = None
        if enabled and uses_tracker(logging, "wandb"):
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.wandb = wandb.init(
                project=logging.wandb_project,
                name=run_id,
                id=run_id,
                dir=str(run_dir),
                mode=logging.wandb_mode,
                resume="allow",
                config=config,
            )
            self.wandb.define_metric("step")
            self.wandb.define_metric(VALIDATION_STEP)
            self.wandb.define_metric(VALIDATION_PREFIX + "*", step_metric=VALIDATION_STEP)
            # A resumed run's summary is the last value of each key its server holds (empty offline and when new).
            self._wandb_upto = int(self.wandb.summary.get("step", 0))
            self._wandb_validated_upto = int(self.wandb.summary.get(VALIDATION_STEP, -1))
        if enabled and uses_tracker(logging, "mlflow"):
            self.mlflow = mlflow_run.Run(logging.mlflow_experiment, run_id)
            self.mlflow.set_status("RUNNING")
            self.mlflow.log_config(config)
            self._mlflow_upto = self._last = self.mlflow.last_step()
            self._mlflow_validated_upto = self.mlflow.last_step(VALIDATED, default=-1)
            resumed = f", resumed after update {self._mlflow_upto}" if self.mlflow.resumed else ""
            log(f"MLflow run {self.mlflow.run_id} ({run_id}{resumed}) at {mlflow_run.redacted(self.mlflow.uri)}")

    def trim(self, upto: int) -> None:
        """Keep only the lines of updates a resumed run will not redo: steps up to `upto`, validation points among
        them (one at update k is written before k's checkpoint; a fresh start passes -1, as it redoes the one at
        update 0)."""
        if not self.enabled or not self.metrics_file.exists():
            return
        kept = [
            line for line in self.metrics_file.read_text().splitlines() if line and json.loads(line)["step"] <= upto
        ]
        atomic.write_text(self.metrics_file, "".join(line + "\n" for line in kept))

    def record(self, metrics: dict) -> None:
        if not self.enabled:
            return
        flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        flat.update({f"reward/{t}": v for t, v in metrics.get("reward_per_task", {}).items()})
        if self.wandb is not None and metrics["step"] > self._wandb_upto:
            for key in sorted(flat.keys() - self._wandb_axis):  # a metric's first row: plot it against the update
                self.wandb.define_metric(key, step_metric="step")
                self._wandb_axis.add(key)
            self.wandb.log(flat)
        if self.mlflow is not None and metrics["step"] > self._mlflow_upto:
            self.mlflow.log_metrics(flat, metrics["step"])
        # Written after the trackers: a line in the file means MLflow holds the update too (its log is synchronous).
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(metrics, sort_keys=True) + "\n")
        self._last = max(self._last, metrics["step"])
        if self._first is None:
            self._first = metrics["step"] - 1
        done = metrics["step"] - self._first
        eta = (time.monotonic() - self._started) / max(done, 1) * (self.total - metrics["step"])
        speed = ""
        if metrics.get("time_tokens_per_s") is not None:
            speed = f" | {metrics['time_tokens_per_s']:.0f} tokens/s"
        if metrics.get("time_mfu") is not None:
            speed += f" | MFU {100 * metrics['time_mfu']:.1f} %"
        if "ppo_ratio_mean" in metrics:
            objective = f" | ratio {metrics['ppo_ratio_mean']:.6f}"
        else:  # DiffusionNFT: no ratio; its implicit policies' losses (equal while the old policy is the trained one)
            objective = f" | L+ {metrics['nft_positive_loss']:.5f} L- {metrics['nft_negative_loss']:.5f}"
        log(
            f"step {metrics['step']}/{self.total} | reward {metrics['reward_mean']:.4f} ± {metrics['reward_std']:.4f}"
            f" | loss {metrics['policy_loss']:+.5f}{objective}"
            f" | stale {metrics['delayed_replay_staleness']:.1f} | {metrics['time_step_s']:.2f} s/update{speed}"
            f" | ETA {math.ceil(eta)} s"
        )

    def record_validation(self, metrics: dict) -> None:
        """One validation point (grpo/validation.py): its `val/*` keys at the step of the update it follows (0 before
        training), per-task rewards as `val/reward/<task>`. It leaves the training progress (ETA, last update) be."""
        if not self.enabled:
            return
        step = metrics["step"]
        flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
        for key, per_task in metrics.items():  # `val/reward/<task>`, and a gold reward's `val/<kind>/reward/<task>`
            if key.endswith("reward_per_task") and isinstance(per_task, dict):
                flat.update({f"{key.removesuffix('reward_per_task')}reward/{t}": v for t, v in per_task.items()})
        if self.wandb is not None and step > self._wandb_validated_upto:
            self.wandb.log({**flat, VALIDATION_STEP: step})
        if self.mlflow is not None and step > self._mlflow_validated_upto:
            self.mlflow.log_metrics(flat, step)
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(metrics, sort_keys=True) + "\n")
        log(
            f"validation at update {step}/{self.total} | reward {metrics[VALIDATED]:.4f} ± "
            f"{metrics[VALIDATION_PREFIX + 'reward_std']:.4f} over {metrics[VALIDATION_PREFIX + 'prompts']} held-out "
            f"prompts | {metrics[VALIDATION_PREFIX + 'reward_errors']} scoring errors | "
            f"{metrics[VALIDATION_PREFIX + 'time_s']:.2f} s" + "".join(gold_lines(metrics))
        )

    def close(self, stopped: bool = False) -> None:
        """`stopped`: training ended early on purpose (train.stop_on_divergence)."""
        if self.wandb is not None:
            self.wandb.finish()
        if self.mlflow is not None:
            # A run that stops short of its last update (an error; a SIGKILL never gets here) is FAILED until a
            # resume sets it RUNNING again.
            self.mlflow.set_status("FINISHED" if stopped or self._last >= self.total else "FAILED")


def gold_lines(metrics: dict) -> list[str]:
    """A validation point's gold rewards (train.validate_rewards) as the progress line says them."""
    found = []
    for kind in gold_kinds([metrics]):
        at = f"{VALIDATION_PREFIX}{kind}/"
        if f"{at}failed" in metrics:
            found.append(f" | {kind} FAILED: {metrics[f'{at}failed']}")
        elif (mean := metrics.get(f"{at}reward_mean")) is not None:
            stderr = metrics.get(f"{at}reward_stderr")
            spread = f" ± {stderr:.4f} (s.e.)" if stderr is not None else ""
            errors = metrics.get(f"{at}reward_errors", 0)
            found.append(f" | {kind} {mean:.4f}{spread}" + (f", {errors} unscored" if errors else ""))
    return found


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)
