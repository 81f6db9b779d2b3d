"""Several rewards (reward.terms): one scorer per reward kind, a rollout's reward the weighted sum of their scores.

Each rollout is submitted to every term's scorer at once, so the terms score concurrently (the EvalKit's pool in
its processes, the judge's requests in its threads): a batch waits for the slower term, not for the sum. Each
term's scorer applies its own fail_on_error in `collect` (evalkit.fail_on_error for the rule reward,
reward.judge_fail_on_error for the judge): a failure it does not tolerate stops the run, the term named; one it
tolerates leaves the term its error score, and the rollout's `error` set, which the trainer counts in
reward_errors. `term_means` gives the trainer each term's raw mean over the gathered rows (`reward/<kind>`).
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from videogrpo.config import training_reward_kinds
from videogrpo.rewards.judge import JudgeError, JudgeScorer
from videogrpo.rewards.rule import EvaluatorError, RuleScorer

# A term's own failure under its fail_on_error, re-raised as the same type with the term named; anything else
# (a full disk, a dead scorer process) is no term's verdict on a sample and passes unchanged.
TERM_FAILURES = (EvaluatorError, JudgeError)


class WeightedScorer:
    """RuleScorer's interface over one scorer per term: `submit` hands the request to each, `collect` returns per
    rollout {"score": sum of weight x raw score, "terms": {kind: raw score}, "error": the terms' errors or None,
    "task", "sample"}; `close` closes every term's scorer."""

    def __init__(self, scorers: dict, weights: dict[str, float]):
        if set(scorers) != set(weights):
            raise ValueError(f"scorers for {sorted(scorers)} but weights for {sorted(weights)}")
        self.kinds = sorted(weights)  # a fixed order: the sum is the same float whatever the YAML's order
        self.scorers, self.weights = scorers, weights

    @classmethod
    def for_config(cls, cfg, evalkit_path: str | Path | None, tasks: list[str]) -> WeightedScorer:
        """The terms of reward.terms, each scorer as the reward alone makes it (its own section, its own
        fail_on_error); the ones started are closed if a later one cannot start."""
        return cls(start_scorers(cfg, evalkit_path, tasks, training_reward_kinds(cfg)), dict(cfg.reward.terms))

    def submit(self, request) -> dict[str, Future]:
        return {kind: self.scorers[kind].submit(request) for kind in self.kinds}

    def collect(self, futures: list[dict[str, Future]]) -> list[dict]:
        by_term = {}
        for kind in self.kinds:
            try:
                by_term[kind] = self.scorers[kind].collect([f[kind] for f in futures])
            except TERM_FAILURES as err:
                raise type(err)(f"reward term {kind} (weight {self.weights[kind]:g} in reward.terms): {err}") from err
        results = []
        for i in range(len(futures)):
            rows = {kind: by_term[kind][i] for kind in self.kinds}
            errors = [f"{kind}: {row['error']}" for kind, row in rows.items() if row.get("error")]
            first = rows[self.kinds[0]]
            results.append(
                {
                    "score": sum(self.weights[kind] * float(row["score"]) for kind, row in rows.items()),
                    "terms": {kind: float(row["score"]) for kind, row in rows.items()},
                    "error": "; ".join(errors) or None,
                    "task": first.get("task"),
                    "sample": first.get("sample"),
                }
            )
        return results

    def close(self, kill: bool = False) -> None:
        """Every term's scorer closes, even when closing one of them fails (that failure is raised after)."""
        failure = None
        for kind in self.kinds:
            try:
                self.scorers[kind].close(kill=kill)
            except BaseException as err:  # noqa: BLE001 - the others still close; the first failure is raised
                failure = failure or err
        if failure is not None:
            raise failure

    def __enter__(self) -> WeightedScorer:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(kill=exc_type is not None)


def start_scorers(
    cfg, evalkit_path: str | Path | None, tasks: list[str], kinds, fail_on_error: bool | None = None, policy: str = ""
) -> dict:
    """One scorer per reward kind of `kinds`, each as the reward alone makes it (its own section; `fail_on_error`,
    when given, overrides that section's, `policy` saying why); the ones started are closed if a later one cannot
    start."""
    scorers: dict = {}
    try:
        for kind in kinds:
            if kind == "vbvr_vlm":
                scorers[kind] = JudgeScorer.for_config(cfg, tasks, fail_on_error=fail_on_error)
            else:
                scorers[kind] = RuleScorer.for_config(cfg, evalkit_path, fail_on_error=fail_on_error, policy=policy)
    except BaseException:
        for scorer in scorers.values():
            scorer.close(kill=True)
        raise
    return scorers


def training_scorer(cfg, evalkit_path: str | Path | None, tasks: list[str]):
    """The scorer of the reward the policy trains on: the weighted terms (reward.terms), the judge or the rule
    reward (reward.kind)."""
    if cfg.reward.terms:
        return WeightedScorer.for_config(cfg, evalkit_path, tasks)
    if cfg.reward.kind == "vbvr_vlm":
        return JudgeScorer.for_config(cfg, tasks)
    return RuleScorer.for_config(cfg, evalkit_path)


def term_means(term_scores: list[dict[str, float] | None]) -> dict[str, float]:
    """Each term's raw mean over the gathered rollouts, as the metrics `reward/<kind>`; {} without terms (a
    rollout scored by one reward has no `terms`)."""
    sums: dict[str, list[float]] = {}
    for scores in term_scores:
        for kind, score in (scores or {}).items():
            sums.setdefault(kind, []).append(score)
    return {f"reward/{kind}": sum(values) / len(values) for kind, values in sorted(sums.items())}
