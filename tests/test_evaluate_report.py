"""Evaluation and the report, checked against what they must show: trained - base, and the CSV itself."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from videogrpo import config

from harness import assert_table_shows_csv, report_tables, trainer_config


@pytest.fixture(scope="module")
def evaluated(tiny_model, dataset, tmp_path_factory):
    """evaluate() with a 'trained' transformer that is the base one perturbed, and with the base itself."""
    from diffusers import WanTransformer3DModel

    from videogrpo.evaluate import evaluate

    root = tmp_path_factory.mktemp("evaluate")
    cfg = config.from_dict(trainer_config(evaluate={"split": "heldout", "max_samples_per_task": None}))
    results = {}
    for name, scale in (("perturbed", 0.2), ("unchanged", 0.0)):
        transformer = WanTransformer3DModel.from_pretrained(tiny_model / "transformer")
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in transformer.parameters():
                p.add_(scale * torch.randn(p.shape, generator=generator))
        transformer.save_pretrained(root / name / "final/transformer")
        results[name] = evaluate(
            cfg,
            tiny_model,
            root / name / "final",
            dataset,
            config.from_dict(trainer_config()).evalkit.path,
            root / name / "videos",
            torch.device("cpu"),
        )
    return results


def test_trained_differs_from_base_and_delta_is_trained_minus_base(evaluated):
    scores, table = evaluated["perturbed"]
    pairs = scores.pivot_table(index=["task", "sample_id"], columns="variant", values="score")
    assert len(pairs) == 3 and not np.allclose(pairs["trained"], pairs["base"])  # one held-out sample per task
    for _, row in table.iterrows():
        part = pairs if row.task == "ALL" else pairs.loc[row.task]
        assert row.trained_score == pytest.approx(part["trained"].mean())
        assert row.base_score == pytest.approx(part["base"].mean())
        assert row.delta == pytest.approx(row.trained_score - row.base_score)
    overall = table[table.task == "ALL"].iloc[0]
    assert overall.delta_ci_low <= overall.delta <= overall.delta_ci_high
    assert overall.trained_se > 0 and overall.samples == 3


def test_the_base_against_itself_is_a_delta_of_exactly_zero(evaluated):
    scores, table = evaluated["unchanged"]
    pairs = scores.pivot_table(index=["task", "sample_id"], columns="variant", values="score")
    assert (pairs["trained"] == pairs["base"]).all()  # the same weights, samples and noise
    assert (table.delta == 0).all()


def test_the_report_shows_the_evaluation_csv_as_it_is(evaluated, tmp_path):
    from videogrpo.provenance.report import render_html

    _, table = evaluated["perturbed"]
    table.to_csv(tmp_path / "per_task.csv", index=False)
    with open(tmp_path / "per_task.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    provenance = {
        "run_id": "r",
        "generated_at": "now",
        "git": {"commit": None},
        "timings": {},
        "digests": {},
        "versions": {},
        "config": {},
    }
    page = render_html(provenance, [], rows)
    assert "No training metrics were recorded" in page and "Reward during training" not in page
    (shown,) = [t for t in report_tables(page) if t[0][:2] == ["task", "samples"]]
    assert_table_shows_csv(shown, rows)


def test_an_interrupted_evaluation_resumes_with_the_batches_it_had_not_scored(
    tiny_model, dataset, tmp_path, monkeypatch
):
    from videogrpo import evaluate as evaluation

    cfg = config.from_dict(trainer_config(evaluate={"split": "rl", "max_samples_per_task": 2}))  # 6: two batches
    kit = config.from_dict(trainer_config()).evalkit.path
    calls = []
    real = evaluation.sample_batch
    monkeypatch.setattr(evaluation, "sample_batch", lambda *a: calls.append(a[-1]) or real(*a))
    records = tmp_path / "records"
    whole, _ = evaluation.evaluate(
        cfg, tiny_model, tiny_model, dataset, kit, tmp_path / "v1", torch.device("cpu"), records
    )
    assert calls == [0, 4, 0, 4]  # base and trained, two batches each
    (records / "trained/batch-000004.json").unlink()  # interrupted before the last batch was scored
    calls.clear()
    resumed, _ = evaluation.evaluate(
        cfg, tiny_model, tiny_model, dataset, kit, tmp_path / "v2", torch.device("cpu"), records
    )
    assert calls == [4]
    assert resumed.equals(whole)
    assert sorted(p.relative_to(tmp_path / "v2") for p in (tmp_path / "v2").rglob("*.mp4")) == sorted(
        p.relative_to(tmp_path / "v1") for p in (tmp_path / "v1").rglob("*.mp4")
    )


def test_a_batch_whose_record_holds_an_error_is_scored_again(tiny_model, dataset, tmp_path, monkeypatch):
    """Under fail_on_error: false an evaluator error is recorded (scored 0); the next attempt scores it again."""
    import json

    from videogrpo import evaluate as evaluation

    cfg = config.from_dict(trainer_config(evaluate={"split": "rl", "max_samples_per_task": 2}))  # 6: two batches
    kit = config.from_dict(trainer_config()).evalkit.path
    records = tmp_path / "records"
    whole, _ = evaluation.evaluate(
        cfg, tiny_model, tiny_model, dataset, kit, tmp_path / "v1", torch.device("cpu"), records
    )
    kept = records / "trained/batch-000004.json"
    rows = json.loads(kept.read_text())
    kept.write_text(json.dumps([dict(rows[0], score=0.0, error="OSError: scorer outage"), *rows[1:]]))
    calls = []
    real = evaluation.sample_batch
    monkeypatch.setattr(evaluation, "sample_batch", lambda *a: calls.append(a[-1]) or real(*a))
    again, _ = evaluation.evaluate(
        cfg, tiny_model, tiny_model, dataset, kit, tmp_path / "v2", torch.device("cpu"), records
    )
    assert calls == [4] and not again.error.any()
    assert again.equals(whole)
