"""Gold rewards and the divergence alarm (train.validate_rewards, docs/options.md: Gold rewards and the divergence
alarm).

A gold reward is a reward kind of the registry (the rule reward over the EvalKit, the VLM judge) that scores every
validation point's videos beside the training reward and that the policy is never trained on. Where the policy
learns to game its training reward, the training reward keeps rising on the held-out prompts while a gold reward
falls. Each validation point samples the same prompts from the same noise (grpo/validation.py), so two points differ
by the weights alone and their scores pair prompt by prompt.

The alarm compares each validation point with the one train.divergence_points points earlier: it fires where the
training reward's mean rose and a gold reward's mean fell by more than train.divergence_sigmas standard errors of its
paired change (the standard deviation of the per-prompt changes over the square root of their count), and by more
than train.divergence_min_change, over all the prompts or within any one task. A prompt a reward failed to score
at either point is left out of that reward's change. Its state (every point's per-prompt scores, and the update it
first fired at) is saved in each checkpoint, so a resumed run fires where an uninterrupted one does.

A gold reward's failures are its own: its scorer tolerates a sample it cannot score (the sample is left out of its
numbers and counted), and a failure of the whole scorer leaves the point without its numbers and says so; either
stops training only with train.validate_rewards_fail_on_error.

May import: `rewards`, `provenance`, `config` and the core modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from videogrpo.provenance.metric_rows import VALIDATION_PREFIX as VAL
from videogrpo.rewards import terms

SCORES = "reward_scores"
"""The per-prompt scores of a validation point (None: not scored), under `val/` and `val/<kind>/`."""
TASKS = "prompt_tasks"
"""The task of each prompt of a validation point, under `val/`."""


class GoldRewardFailed(RuntimeError):
    """A gold reward failed at a validation point while train.validate_rewards_fail_on_error is true."""


def start_scorers(cfg, evalkit_path, tasks: list[str]) -> dict:
    """One scorer per gold reward, each tolerating a sample it cannot score (its numbers leave it out)."""
    why = "a gold reward: the samples it cannot score are left out of its numbers"
    return terms.start_scorers(cfg, evalkit_path, tasks, cfg.train.validate_rewards, fail_on_error=False, policy=why)


def collect(scorers: dict, futures: dict[str, list], fail: bool) -> dict[str, list[float | None] | str]:
    """Each gold reward's per-sample scores (None where it failed on the sample), or the message of its scorer's own
    failure; with `fail` (train.validate_rewards_fail_on_error) either raises GoldRewardFailed, the reward named."""
    found: dict[str, list[float | None] | str] = {}
    for kind, scorer in scorers.items():
        try:
            results = scorer.collect(futures[kind])
        except Exception as err:  # noqa: BLE001 - a gold reward's scorer down is its point's gap, not the run's end
            if fail:
                raise GoldRewardFailed(f"gold reward {kind} (train.validate_rewards): {err}") from err
            found[kind] = f"{type(err).__name__}: {err}"
            continue
        scores = [None if r.get("error") else float(r["score"]) for r in results]
        if fail and None in scores:
            bad = next(r for r in results if r.get("error"))
            raise GoldRewardFailed(
                f"gold reward {kind} (train.validate_rewards) could not score {bad.get('sample')} "
                f"({bad.get('error')}), and train.validate_rewards_fail_on_error is true"
            )
        found[kind] = scores
    return found


def summary(prefix: str, scores: list[float | None], tasks: list[str]) -> dict:
    """The metrics of one reward at one point: mean, std (population, over the scored prompts), standard error,
    per-task means, errors and the per-prompt scores, under `prefix` (`val/` or `val/<kind>/`)."""
    scored = np.array([s for s in scores if s is not None], dtype=np.float64)
    per_task: dict[str, list[float]] = {}
    for score, task in zip(scores, tasks):
        if score is not None:
            per_task.setdefault(task, []).append(score)
    n = len(scored)
    return {
        f"{prefix}reward_mean": float(scored.mean()) if n else None,
        f"{prefix}reward_std": float(scored.std()) if n else None,
        f"{prefix}reward_stderr": float(scored.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
        f"{prefix}reward_per_task": {task: float(np.mean(v)) for task, v in sorted(per_task.items())},
        f"{prefix}reward_errors": len(scores) - n,
        f"{prefix}{SCORES}": list(scores),
    }


@dataclass
class Point:
    """One validation point as the alarm reads it."""

    update: int
    tasks: list[str]
    train: list[float | None]
    gold: dict[str, list[float | None] | None]
    """Each gold reward's per-prompt scores; None where its scorer failed at this point."""


@dataclass
class Signal:
    """A divergence found at a point: in `task` (None: over all prompts), since update `since`."""

    reward: str
    task: str | None
    since: int
    train_change: float
    gold_change: float
    gold_stderr: float
    prompts: int

    def describe(self) -> str:
        where = f"in task {self.task}" if self.task else "over all prompts"
        return (
            f"{self.reward} fell {self.gold_change:+.4f} (standard error {self.gold_stderr:.4f}, {self.prompts} "
            f"prompts) while the training reward rose {self.train_change:+.4f}, {where}, since update {self.since}"
        )


def _paired(now: list[float | None], then: list[float | None], rows: list[int]) -> np.ndarray:
    return np.array([now[i] - then[i] for i in rows if now[i] is not None and then[i] is not None], dtype=np.float64)


def divergence(now: Point, then: Point, sigmas: float, min_change: float = 0.0) -> list[Signal]:
    """Where, from `then` to `now`, the training reward's mean rose and a gold reward's fell by more than `sigmas`
    standard errors of its paired change, and by more than `min_change`: over all prompts, then per task (a scope
    needs 2 prompts scored at both)."""
    scopes: list[tuple[str | None, list[int]]] = [(None, list(range(len(now.tasks))))]
    for task in sorted(set(now.tasks)):
        scopes.append((task, [i for i, t in enumerate(now.tasks) if t == task]))
    found = []
    for task, rows in scopes:
        train = _paired(now.train, then.train, rows)
        if not len(train) or train.mean() <= 0:
            continue
        for kind in sorted(now.gold):
            if now.gold[kind] is None or then.gold.get(kind) is None:
                continue
            change = _paired(now.gold[kind], then.gold[kind], rows)
            if len(change) < 2:
                continue
            stderr = float(change.std(ddof=1) / math.sqrt(len(change)))
            if change.mean() < 0 and -change.mean() > max(sigmas * stderr, min_change):
                found.append(
                    Signal(kind, task, then.update, float(train.mean()), float(change.mean()), stderr, len(change))
                )
    return found


@dataclass
class Watch:
    """The alarm over a run's validation points: `observe` each point's metrics record (it adds the alarm's keys and
    returns what to log); `state` and `restore` carry it through a checkpoint."""

    kinds: list[str]
    points: int
    sigmas: float
    min_change: float = 0.0
    """train.divergence_min_change: the smallest fall of a gold reward's mean that counts."""
    best_by: str | None = None
    """train.keep_best_by: the gold reward whose best point's weights are kept (grpo/export.py)."""
    stop: bool = False
    """train.stop_on_divergence, unless train.resume_past_divergence: training ends at the checkpoint after the
    alarm (and a rerun trains no further)."""
    history: list[Point] = field(default_factory=list)
    fired_at: int | None = None
    """The first update the alarm fired at (None: not yet)."""
    best: dict | None = None
    """The best point so far by `best_by`: {reward, update, score, stderr} (the first of equal scores)."""
    improved: bool = False
    """Whether the point `observe` saw last is the new best (its weights are to be kept)."""

    @classmethod
    def for_config(cls, cfg) -> Watch | None:
        t = cfg.train
        if not t.validate_rewards:
            return None
        stop = t.stop_on_divergence and not t.resume_past_divergence
        return cls(
            sorted(t.validate_rewards), t.divergence_points, t.divergence_sigmas, t.divergence_min_change,
            t.keep_best_by, stop,
        )  # fmt: skip

    def stops(self) -> bool:
        """Whether training ends at this checkpoint: the alarm has fired and train.stop_on_divergence is set."""
        return self.stop and self.fired_at is not None

    def observe(self, record: dict) -> list[str]:
        """Add `val/divergence*` to the point's record; the lines to log (the alarm's first firing said loudest)."""
        failed = {kind for kind in self.kinds if f"{VAL}{kind}/failed" in record}
        gold = {kind: None if kind in failed else record[f"{VAL}{kind}/{SCORES}"] for kind in self.kinds}
        point = Point(record["step"], list(record[f"{VAL}{TASKS}"]), record[f"{VAL}{SCORES}"], gold)
        self.history = [p for p in self.history if p.update < point.update] + [point]
        back = len(self.history) > self.points
        signals = divergence(point, self.history[-1 - self.points], self.sigmas, self.min_change) if back else []
        lines = []
        if signals and self.fired_at is None:
            self.fired_at = point.update
            lines.append(f"DIVERGENCE ALARM at update {point.update}: " + "; ".join(s.describe() for s in signals))
        elif signals:
            lines.append(f"divergence at update {point.update} (the alarm first fired at update {self.fired_at}): "
                         + "; ".join(s.describe() for s in signals))  # fmt: skip
        record[f"{VAL}divergence"] = [vars(s) for s in signals]
        record[f"{VAL}divergence_alarm"] = int(bool(signals))
        record[f"{VAL}divergence_first_update"] = self.fired_at
        self.improved = False
        if self.best_by:
            score = None if self.best_by in failed else record[f"{VAL}{self.best_by}/reward_mean"]
            if score is not None and (self.best is None or score > self.best["score"]):
                stderr = record[f"{VAL}{self.best_by}/reward_stderr"]
                self.best = {"reward": self.best_by, "update": point.update, "score": score, "stderr": stderr}
                self.improved = True
                lines.append(f"best point by {self.best_by} so far: update {point.update} ({score:.4f}); its weights "
                             "are kept (train.keep_best_by)")  # fmt: skip
            record[f"{VAL}best_update"] = self.best["update"] if self.best else None
        return lines

    def state(self) -> dict:
        return {"fired_at": self.fired_at, "best": self.best, "history": [vars(p) for p in self.history]}

    def restore(self, state: dict | None, upto: int) -> None:
        """The state a checkpoint saved after update `upto` (none: a checkpoint written without gold rewards)."""
        state = state or {}
        self.history = [Point(**p) for p in state.get("history", []) if p["update"] <= upto]
        fired, best = state.get("fired_at"), state.get("best")
        self.fired_at = fired if fired is not None and fired <= upto else None
        self.best = best if best is not None and best["update"] <= upto else None
