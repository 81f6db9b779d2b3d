"""`videogrpo compare`'s numbers on made-up runs (evaluation/comparison.py): the paired difference between runs, the
held-out rows, the modelled GPU-hours, and the refusals. The whole command on real runs:
tests/test_workflow_algorithms.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from videogrpo.errors import VideoGRPOError
from videogrpo.evaluation import comparison
from videogrpo.evaluation.aggregate import bootstrap_interval
from videogrpo.provenance import page_cells


def scores(path: Path, values: dict[str, float]) -> Path:
    path.write_text("name,score\n" + "".join(f"{name},{value}\n" for name, value in values.items()))
    return path


def record(tmp_path: Path, name: str, values: dict[str, float], sampler: str = "euler", **grpo) -> comparison.RunRecord:
    run_dir = tmp_path / name
    run_dir.mkdir()
    cell = scores(run_dir / "scores.csv", values)
    check = {
        f"trained:{sampler}": {
            "mean": "0.5",
            "delta_vs_base": "0.01",
            "delta_ci_low": "-0.02",
            "delta_ci_high": "0.04",
        },
        f"base:{sampler}": {"mean": "0.49"},
    }
    metrics = [
        {"step": 1, "reward_mean": 0.2, "model_flops_per_update": 3e15, "inference_flops_per_update": 1e15,
         "time_step_s": 2.0},
        {"step": 2, "reward_mean": 0.5, "model_flops_per_update": 3e15, "inference_flops_per_update": 1e15,
         "time_step_s": 4.0},
    ]  # fmt: skip
    params = {
        "grpo": {"sampler": sampler, "eta": 0.7, "eta_range": None, **grpo},
        "matrix": {"bootstrap": 50, "seed": 3},
    }
    return comparison.RunRecord(run_dir, params, metrics, check, {f"trained:{sampler}": cell}, "CPU (vm)", 50, 3)


def test_the_paired_difference_is_each_sample_against_itself_with_the_first_runs_bootstrap(tmp_path):
    first = record(tmp_path, "a", {"s1": 0.1, "s2": 0.5, "s3": 0.9}, sampler="euler")
    second = record(tmp_path, "b", {"s3": 1.0, "s1": 0.3, "s2": 0.4}, sampler="euler", algorithm="nft")
    (row,) = comparison.paired_rows([first, second])
    deltas = np.array([0.3 - 0.1, 0.4 - 0.5, 1.0 - 0.9])  # by name, whatever the files' order
    assert row["mean difference"] == pytest.approx(deltas.mean())
    low, high = bootstrap_interval(deltas, 50, 3)
    assert row["95 % interval"] == f"[{low:.4f}, {high:.4f}]" and row["samples"] == 3
    # Shown as a config file writes them: text bare like every other value.
    assert comparison.differing_fields([first, second]) == [{"grpo.algorithm": "-"}, {"grpo.algorithm": "nft"}]
    third = record(tmp_path, "c", {"s1": 0.1}, sampler="euler", sde_window_range=[0, 4], eta_range=None)
    assert comparison.differing_fields([first, third])[1] == {"grpo.sde_window_range": "[0, 4]"}


def test_runs_whose_matrices_scored_other_samples_are_refused_naming_the_file(tmp_path):
    first = record(tmp_path, "a", {"s1": 0.1, "s2": 0.5})
    other = record(tmp_path, "b", {"s1": 0.1, "s9": 0.5})
    with pytest.raises(VideoGRPOError, match=r"b/scores.csv scored other samples than .*a/scores.csv"):
        comparison.paired_rows([first, other])


def test_gpu_hours_are_every_updates_flops_at_the_assumed_peak_and_mfu(tmp_path):
    run = record(tmp_path, "a", {"s1": 0.1})
    row = comparison.training_summary(run, peak_flops=1e15, mfu=0.5)
    assert row["modelled GPU-h"] == pytest.approx(8e15 / (1e15 * 0.5) / 3600)
    assert row["reward per update"] == pytest.approx(0.3) and row["wall s per update"] == 3.0
    assert row["reward per modelled GPU-h"] == pytest.approx(0.3 / row["modelled GPU-h"])
    # A tiny run's figures span orders of magnitude: significant digits on the page, never "0.0000".
    page = comparison.render_html([run], comparison.tables([run], 1e15, 0.5), 1e15, 0.5, "test")
    assert f"<td>{page_cells.significant(row['modelled GPU-h'])}</td>" in page and "0.0000<" not in page
    assert page_cells.significant(row["modelled GPU-h"]) == "0.004444"
    assert page_cells.significant(20_692_776.4) == "20,692,776" and page_cells.significant(1.5e-9) == "1.500e-09"
    (held,) = comparison.heldout_rows([run])
    assert (
        held["sampler"] == "euler" and held["trained - base"] == 0.01 and held["95 % interval"] == "[-0.0200, 0.0400]"
    )


def test_a_file_changed_since_its_manifest_is_refused(tmp_path):
    from videogrpo.provenance import digest

    path = scores(tmp_path / "scores.csv", {"s1": 0.1})
    recorded = {"path": str(path), "sha256": digest.sha256_file(path)}
    assert comparison._checked(recorded, tmp_path / "matrix.manifest.json", "scores") == path
    path.write_text(path.read_text() + "s2,0.2\n")
    with pytest.raises(VideoGRPOError, match=r"scores.csv: its sha256 is not the one .*matrix.manifest.json records"):
        comparison._checked(recorded, tmp_path / "matrix.manifest.json", "scores")
