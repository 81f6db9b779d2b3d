"""Evaluation and the report, checked against what they must show: trained - base, and the CSV itself."""

from __future__ import annotations

import csv
import html
import re

import numpy as np
import pytest
import torch

from videogrpo import config

from harness import assert_table_shows_csv, report_tables, trainer_config


@pytest.fixture(scope="module")
def evaluated(tiny_model, dataset, tmp_path_factory):
    """evaluate() with a 'trained' transformer that is the base one perturbed, and with the base itself."""
    from diffusers import WanTransformer3DModel

    from videogrpo.evaluation.heldout import evaluate

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
    from videogrpo.provenance.report_page import render_html

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
    from videogrpo.evaluation import heldout as evaluation

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

    from videogrpo.evaluation import heldout as evaluation

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


@pytest.mark.parametrize("fail_on_error", [True, False])
def test_an_evaluation_sample_missing_its_ground_truth_video_follows_fail_on_error(
    tiny_model, dataset, tmp_path, fail_on_error
):
    """The stand-in EvalKit would score a sample without its ground_truth.mp4 and say nothing (as the public one
    does for a task that does not read it): the evaluation stops naming the file, or records it as that sample's
    error at evalkit.unsupported_score in both variants."""
    import shutil
    from pathlib import Path

    from videogrpo.data.dataset import load_split
    from videogrpo.evaluation import heldout as evaluation
    from videogrpo.rewards.rule import EvaluatorError

    copy = Path(shutil.copytree(dataset, tmp_path / "dataset"))
    victim = load_split(copy, "rl")[0]
    (victim.directory / "video/ground_truth.mp4").unlink()
    gone = f"missing at scoring time: {victim.directory / 'video/ground_truth.mp4'} (ground-truth video, gt_video_path)"
    sections = {"split": "rl", "max_samples_per_task": 1}
    cfg = config.from_dict(
        trainer_config(evaluate=sections, evalkit={"fail_on_error": fail_on_error, "unsupported_score": 0.25})
    )
    kit = cfg.evalkit.path

    def run():
        return evaluation.evaluate(cfg, tiny_model, tiny_model, copy, kit, tmp_path / "v", torch.device("cpu"))

    if fail_on_error:
        with pytest.raises(EvaluatorError, match=re.escape(gone)):
            run()
        return
    scores, _ = run()
    failed = scores[scores.error != ""]
    assert sorted(failed.variant) == ["base", "trained"] and set(failed.sample_id) == {victim.sample_id}
    assert (failed.score == 0.25).all() and all(gone in error for error in failed.error)
    assert len(scores) == 6 and (scores[scores.error == ""].score > 0).all()


def _provenance(**timings) -> dict:
    return {
        "run_id": "r",
        "generated_at": "now",
        "git": {"commit": None},
        "timings": timings,
        "digests": {},
        "versions": {},
        "config": {},
    }


def test_a_value_that_rounds_to_zero_is_shown_without_a_sign():
    from videogrpo.provenance.report_page import fixed, render_html

    assert [fixed(v) for v in (-2.9e-05, -0.0, 2.9e-05, -0.00009, -0.0009)] == [
        "0.0000",
        "0.0000",
        "0.0000",
        "-0.0001",
        "-0.0009",
    ]
    assert fixed(-0.0004, 3) == "0.000" and fixed(float("nan")) == "nan"
    row = {"task": "ALL", "samples": "6", "delta": "-2.9000502486220547e-05", "delta_ci_low": "-6.4e-05"}
    matrix = [
        {
            "model": "trained",
            "sampler": "unipc",
            "domain": "overall",
            "mean": "0.3",
            "ci_low": "-0.0002",
            "ci_high": "1",
        }
    ]
    metrics = [
        {"step": 1, "reward_mean": 0.5, "reward_std": 0.1, "policy_loss": -3e-07, "learning_rate": 1e-4},
    ]
    page = render_html(_provenance(), metrics, [row], {}, matrix)
    assert not re.search(r"-0\.0+(?![0-9])", page), page
    tables = report_tables(page)
    (evaluation,) = [t for t in tables if t[0][:2] == ["task", "samples"]]
    assert evaluation[1][2:] == ["0.0000", "-0.0001"]
    (pivot,) = [t for t in tables if t[0] == ["model", "unipc"]]
    assert pivot[1] == ["trained", "0.300 [0.000, 1.000]"]


def test_the_learning_rate_column_shows_the_warm_up_and_the_decay():
    from videogrpo.grpo.lr_schedule import learning_rate
    from videogrpo.provenance.report_page import learning_rate_text, render_html

    rates = [learning_rate(k, 3, 8, 1e-4) for k in range(8)]
    metrics = [{"step": k + 1, "reward_mean": 0.5, "reward_std": 0.1, "learning_rate": r} for k, r in enumerate(rates)]
    (shown,) = [t for t in report_tables(render_html(_provenance(), metrics, [])) if "learning_rate" in t[0]]
    column = [row[shown[0].index("learning_rate")] for row in shown[1:]]
    assert column[:4] == ["0.00e+00", "3.33e-05", "6.67e-05", "1.00e-04"]
    assert len(set(column)) == len(rates)  # fixed decimals showed 0.0000 0.0000 0.0001 0.0001 ...
    assert all(abs(float(text) - rate) <= 0.005 * rate for text, rate in zip(column, rates))
    assert learning_rate_text("5e-05") == "5.00e-05"  # as a CSV would give it


def test_a_stage_that_ran_outside_slurm_is_shown_as_local_not_none():
    from videogrpo.provenance import trace
    from videogrpo.provenance.report_page import LOCAL_TITLE, render_html

    def manifest(second: int, job: str | None) -> dict:  # as written before manifests had a cost block
        start, end = (f"2026-12-01T10:00:{s:02d}.000+00:00" for s in (second, second + 1))
        return {"started_at": start, "ended_at": end, "duration_s": 1.0, "host": "vm", "slurm_job_id": job}

    jobs = trace.rows_of({"train": manifest(0, "4242"), "report": manifest(5, None)}, sacct=False)
    page = render_html(dict(_provenance(), cost={"jobs": jobs, "totals": trace.totals(jobs)}), [], [])
    (stages,) = [t for t in report_tables(page) if t[0][0] == "stage"]
    assert [row[:2] for row in stages[1:3]] == [
        ["train", "4242"],
        ["report", f"<span title='{html.escape(LOCAL_TITLE)}'>local</span>"],
    ]
    assert stages[1][6:] == ["–", "–", "–"]  # CPU-h, GPUs, GPU-h: unknown for a manifest without them
    assert ">None<" not in page and "SLURM_JOB_ID" in LOCAL_TITLE


def test_the_videos_pair_base_and_trained_of_the_same_sample():
    from videogrpo.provenance.report_page import render_html, video_pairs

    tasks = ["S-1_move", "S-2_fill"]

    def paths(variant: str, samples: list[str]) -> list[str]:
        return [f"../evaluate/videos/{variant}/{task}/{s}.mp4" for task in tasks for s in samples]

    # Sorted paths put every base video first: the old page showed two base videos per task.
    videos = {
        "base": paths("base", ["a_00001", "a_00002", "a_00003"]),
        "trained": paths("trained", ["a_00003", "a_00001"]),
    }
    pairs, total = video_pairs(videos)
    assert total == 4 and [(task, sample) for task, sample, _, _ in pairs] == [
        (task, s) for task in tasks for s in ("a_00001", "a_00003")
    ]
    for task, sample, base, trained in pairs:
        assert base == f"../evaluate/videos/base/{task}/{sample}.mp4"
        assert trained == f"../evaluate/videos/trained/{task}/{sample}.mp4"
    page = render_html(_provenance(), [], [{"task": "ALL", "samples": "4"}], videos)
    rows = re.findall(r"<tr><th scope='row'>(.*?)</tr>", page)
    assert len(rows) == 4
    for row, (task, sample, base, trained) in zip(rows, pairs):
        assert row.startswith(f"{task}<br><code>{sample}</code></th>")
        assert re.findall(r"<video src='([^']+)'", row) == [base, trained]
    assert "<th>base</th><th>trained</th>" in page
    shown, total = video_pairs({v: [f"{v}/t{k}/s{j}.mp4" for k in range(9) for j in range(5)] for v in videos}, 6, 2)
    assert total == 45 and len(shown) == 12 and len({task for task, *_ in shown}) == 6


def test_update_axes_have_integer_ticks_and_task_titles_show_the_whole_name():
    from videogrpo.provenance.report_page import per_task_curves_figure, reward_curve_figure

    long = [
        "G-134_select_next_figure_large_small_alternating_sequence_data-generator",
        "G-131_select_next_figure_increasing_size_sequence_data-generator",
        "S-1_move_red_square_data-generator",
        "x" * 70,  # no break point at all
        "S-2",
        "S-3_grow_bar_to_line_data-generator",
    ]
    metrics = [
        {"step": k, "reward_mean": 0.1 * k, "reward_std": 0.01, "reward_per_task": {t: 0.1 * k for t in long}}
        for k in range(1, 5)
    ]
    for fig in (reward_curve_figure(metrics), per_task_curves_figure(metrics)):
        fig.canvas.draw()
        for ax in fig.axes:
            if ax.axison:
                low, high = ax.get_xlim()
                ticks = [t for t in ax.get_xticks() if low <= t <= high]
                assert len(ticks) >= 2 and all(t == int(t) for t in ticks), ticks
    fig = per_task_curves_figure(metrics)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.axison]
    assert sorted(ax.get_title().replace("\n", "") for ax in shown) == sorted(long)
    boxes = [ax.title.get_window_extent(renderer) for ax in shown]
    width, height = fig.canvas.get_width_height()
    for k, box in enumerate(boxes):
        assert 0 <= box.x0 and box.x1 <= width and box.y1 <= height, (shown[k].get_title(), box)
        for other in boxes[k + 1 :]:  # no title runs into another panel's title
            assert box.x1 <= other.x0 or other.x1 <= box.x0 or box.y1 <= other.y0 or other.y1 <= box.y0
