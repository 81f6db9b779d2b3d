"""Aggregates of scored cells: per task, per domain and overall, the matrix of cells and the run's per-task table.

Means are plain means over samples (the reference's summaries; with the release split's equal task sizes
they equal the means of task means), with their standard errors. Intervals are 95 % percentile bootstraps over
samples; the change from the base model pairs each sample with itself (same prompt, first frame and noise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from videogrpo.evaluation.evalset import DOMAINS

OVERALL = "overall"
ALL = "ALL"
"""The `task` of a cell's row over all its samples in the per-task table."""


def bootstrap_interval(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of `values` (NaN below two values)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def standard_error(values: np.ndarray) -> float:
    """The standard error of the mean of `values` (NaN below two values)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


def _statistics(values: np.ndarray, resamples: int, seed: int) -> dict:
    low, high = bootstrap_interval(values, resamples, seed)
    return {
        "samples": len(values),
        "mean": float(np.mean(values)),
        "se": standard_error(values),
        "ci_low": low,
        "ci_high": high,
    }


def _groups(scores: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(level, name, rows): each task, each domain present, and all samples."""
    groups = [("task", task, part) for task, part in scores.groupby("task", sort=True)]
    groups += [("domain", d, scores[scores.domain == d]) for d in DOMAINS if (scores.domain == d).any()]
    return groups + [(OVERALL, OVERALL, scores)]


def summarize(scores: pd.DataFrame, resamples: int, seed: int) -> pd.DataFrame:
    """One cell: one row per task, domain and overall: samples, mean score, its standard error and bootstrap
    interval."""
    rows = [
        {"level": level, "name": name, **_statistics(part.score.to_numpy(), resamples, seed)}
        for level, name, part in _groups(scores)
    ]
    return pd.DataFrame(rows)


def _cell_rows(
    cells: dict[tuple[str, str], pd.DataFrame], base: str | None, resamples: int, seed: int, levels: tuple[str, ...]
) -> list[dict]:
    """Every cell's groups of `levels` (`_groups`), each with its statistics and, for a model other than `base`
    under a sampler that has a base cell, the paired change from it: each sample against itself in the base cell
    (same prompt, first frame and noise), a 95 % bootstrap interval over those differences."""
    rows = []
    for (model, sampler), scores in cells.items():
        base_scores = cells.get((base, sampler)) if base and model != base else None
        base_by_name = base_scores.set_index("name").score if base_scores is not None else None
        by_name = scores.set_index("name").score
        for level, name, part in _groups(scores):
            if level not in levels:
                continue
            row = {"model": model, "sampler": sampler, "level": level, "name": name, "domain": name}
            if level == "task":
                row.update(domain=part.domain.iloc[0], task=name)
            elif level == OVERALL and "task" in levels:
                row.update(domain=OVERALL, task=ALL)
            row.update(_statistics(part.score.to_numpy(), resamples, seed))
            names = part["name"].to_numpy()
            if base_by_name is not None:
                deltas = by_name.loc[names].to_numpy() - base_by_name.loc[names].to_numpy()
                row["delta_vs_base"] = float(deltas.mean())
                row["delta_ci_low"], row["delta_ci_high"] = bootstrap_interval(deltas, resamples, seed)
            for other in PAIRED_WITH.get(model, ()):  # the prompt refiners' cells: what each part contributed
                if (other, sampler) in cells:
                    other_by_name = cells[(other, sampler)].set_index("name").score
                    deltas = by_name.loc[names].to_numpy() - other_by_name.loc[names].to_numpy()
                    row[f"delta_vs_{other}"] = float(deltas.mean())
                    low, high = bootstrap_interval(deltas, resamples, seed)
                    row[f"delta_vs_{other}_ci_low"], row[f"delta_vs_{other}_ci_high"] = low, high
            rows.append(row)
    return rows


PAIRED_WITH = {"refined": ("trained", "base_refiners"), "base_refiners": ("trained",)}
"""The matrix models (config/cells.py's REFINED_MODELS) paired with others beside the base: the trained generator
behind the trained refiners against it alone (what the trained refiners add) and behind the refiners it started from
(what training them added); behind those against it alone (what the untrained refiners do)."""
PAIRED_COLUMNS = tuple(
    f"delta_vs_{other}{end}" for other in ("trained", "base_refiners") for end in ("", "_ci_low", "_ci_high")
)


MATRIX_COLUMNS = ("model", "sampler", "domain")
PER_TASK_COLUMNS = ("model", "sampler", "domain", "task")
STATISTICS = (
    "samples",
    "mean",
    "se",
    "ci_low",
    "ci_high",
    "delta_vs_base",
    "delta_ci_low",
    "delta_ci_high",
    *PAIRED_COLUMNS,
)


def _table(rows: list[dict], keys: tuple[str, ...]) -> pd.DataFrame:
    columns = [*keys, *(c for c in STATISTICS if any(c in row for row in rows))]
    return pd.DataFrame([{c: row.get(c) for c in columns} for row in rows], columns=columns)


def matrix_table(
    cells: dict[tuple[str, str], pd.DataFrame], base: str | None, resamples: int, seed: int
) -> pd.DataFrame:
    """Every cell's domain and overall means with standard errors and intervals, and (given the base model's
    name) each other model's paired change from the base under the same sampler."""
    return _table(_cell_rows(cells, base, resamples, seed, ("domain", OVERALL)), MATRIX_COLUMNS)


def per_task_table(
    cells: dict[tuple[str, str], pd.DataFrame], base: str | None, resamples: int, seed: int
) -> pd.DataFrame:
    """The per-task table of the run: every cell's tasks and its overall (`task` ALL), with standard errors,
    intervals and the paired change from the base cell of the same sampler; by sampler, then task (ALL last),
    then model, so that the models of a task stand together. The held-out check is its rows of the trained and
    base models under the training sampler."""
    rows = _cell_rows(cells, base, resamples, seed, ("task", OVERALL))
    samplers = list(dict.fromkeys(sampler for _, sampler in cells))
    models = list(dict.fromkeys(model for model, _ in cells))
    rows.sort(key=lambda r: (samplers.index(r["sampler"]), r["task"] == ALL, r["task"], models.index(r["model"])))
    return _table(rows, PER_TASK_COLUMNS)
