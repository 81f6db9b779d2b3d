"""Aggregates of scored cells: per task, per domain and overall, and the matrix of cells.

Means are plain means over samples (the reference's summaries; with the release split's equal task sizes
they equal the means of task means). Intervals are 95 % percentile bootstraps over samples; the change
from the base model pairs each sample with itself (same prompt, first frame and noise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from videogrpo.evaluation.evalset import DOMAINS

OVERALL = "overall"


def bootstrap_interval(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of `values` (NaN below two values)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def _groups(scores: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(level, name, rows): each task, each domain present, and all samples."""
    groups = [("task", task, part) for task, part in scores.groupby("task", sort=True)]
    groups += [("domain", d, scores[scores.domain == d]) for d in DOMAINS if (scores.domain == d).any()]
    return groups + [(OVERALL, OVERALL, scores)]


def summarize(scores: pd.DataFrame, resamples: int, seed: int) -> pd.DataFrame:
    """One row per task, domain and overall: samples, mean score, its bootstrap interval."""
    rows = []
    for level, name, part in _groups(scores):
        low, high = bootstrap_interval(part.score.to_numpy(), resamples, seed)
        rows.append(
            {
                "level": level,
                "name": name,
                "samples": len(part),
                "mean": float(part.score.mean()),
                "ci_low": low,
                "ci_high": high,
            }
        )
    return pd.DataFrame(rows)


def matrix_table(
    cells: dict[tuple[str, str], pd.DataFrame], base: str | None, resamples: int, seed: int
) -> pd.DataFrame:
    """Every cell's domain and overall means with intervals, and (given the base model's name) each other
    model's paired change from the base under the same sampler."""
    rows = []
    for (model, sampler), scores in cells.items():
        indexed = scores.set_index("name").score
        base_scores = cells.get((base, sampler)) if base and model != base else None
        for level, name, part in _groups(scores):
            if level == "task":
                continue
            low, high = bootstrap_interval(part.score.to_numpy(), resamples, seed)
            row = {
                "model": model,
                "sampler": sampler,
                "domain": name,
                "samples": len(part),
                "mean": float(part.score.mean()),
                "ci_low": low,
                "ci_high": high,
            }
            if base_scores is not None:
                names = part["name"].to_numpy()
                deltas = indexed.loc[names].to_numpy() - base_scores.set_index("name").score.loc[names].to_numpy()
                row["delta_vs_base"] = float(deltas.mean())
                row["delta_ci_low"], row["delta_ci_high"] = bootstrap_interval(deltas, resamples, seed)
            rows.append(row)
    return pd.DataFrame(rows)
