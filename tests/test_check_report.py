"""The held-out check and the report: the run's evaluation set built from each split of the dataset, the trained and
base cells under the training sampler (a DanceGRPO transition and a per-sample eta range among the samplers), the
per-task table's paired bootstrap of the pair, and the page showing what the CSV holds."""

from __future__ import annotations

import csv
import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from videogrpo import cli, config
from videogrpo.config.cells import Sampler, check_models, matrix_cells, number_text, parse_sampler, training_sampler
from videogrpo.data.dataset import load_split
from videogrpo.evaluation.aggregate import ALL, bootstrap_interval, per_task_table
from videogrpo.evaluation.evalset import load_samples
from videogrpo.provenance.manifest import StageRun

from conftest import TASKS
from harness import assert_check_shows_csv, report_tables, trainer_config

CPU = torch.device("cpu")


def materialize_manifest(dataset: Path, out: Path) -> Path:
    """materialize_dataset's manifest of `dataset`, as the workflow writes it: eval_set checks its inputs against it."""
    manifest = out / "materialize_dataset.manifest.json"
    with StageRun("materialize_dataset", manifest, inputs={}) as made:
        made.output("raw", dataset / "raw")
        for name in ("dataset.json", "splits.json"):
            made.output(name, dataset / name)
    return manifest


def build_eval_set(dataset: Path, manifest: Path, out: Path, **matrix) -> int:
    """`videogrpo eval-set --dataset ...` as the workflow runs it without matrix.eval_set."""
    argv = ["stage", "eval-set", "--config-json", json.dumps({"matrix": matrix}), "--dataset", str(dataset)]
    argv += ["--out-tree", str(out / "tree"), "--samples", str(out / "samples.json")]
    argv += ["--final-frames", str(out / "final_frames"), "--upstream", str(manifest)]
    return cli.main([*argv, "--manifest", str(out / "eval_set.manifest.json")])


@pytest.fixture(scope="module")
def upstream(dataset, tmp_path_factory) -> Path:
    return materialize_manifest(dataset, tmp_path_factory.mktemp("materialized"))


def test_the_evaluation_set_is_built_from_the_held_out_split(dataset, upstream, tmp_path):
    """The held-out samples (one per task here), in the release layout: the dataset's files as they are, the
    sample id as metadata.json's task_id, the dataset's own final frame; each chosen sample checked against
    materialize_dataset's manifest."""
    assert build_eval_set(dataset, upstream, tmp_path, split="heldout", samples_per_task=None) == 0
    tree, samples = load_samples(tmp_path / "samples.json", check=("first_frame.png", "prompt.txt"))
    heldout = load_split(dataset, "heldout")
    assert tree == (tmp_path / "tree").resolve() and len(heldout) == len(TASKS)
    assert [(s.task, s.sample_id) for s in samples] == [(r.task, r.sample_id) for r in heldout]
    assert [s.name for s in samples] == [f"In-Domain_50/{task}/00000" for task in TASKS]
    for sample, ref in zip(samples, heldout, strict=True):
        where = tree / sample.name
        for leaf, source in (
            ("first_frame.png", "first_frame.png"),
            ("prompt.txt", "video/prompt.txt"),
            ("ground_truth.mp4", "video/ground_truth.mp4"),
        ):
            assert (where / leaf).read_bytes() == (ref.directory / source).read_bytes(), (sample.name, leaf)
        metadata = json.loads((where / "metadata.json").read_text())
        assert metadata == dict(json.loads((ref.directory / "metadata.json").read_text()), task_id=ref.sample_id)
        final = tmp_path / "final_frames" / f"{sample.name}.png"
        assert final.read_bytes() == (ref.directory / "video/final_frame.png").read_bytes()
    manifest = json.loads((tmp_path / "eval_set.manifest.json").read_text())
    assert {f"sample {r.task}/{r.sample_id}" for r in heldout} <= set(manifest["inputs"])
    assert manifest["summary"]["samples"] == 3 and manifest["summary"]["per_domain"] == {"In-Domain_50": 3}
    assert set(manifest["outputs"]) == {"tree", "samples", "final_frames"}


@pytest.mark.parametrize("per_task", [1, None])
def test_the_evaluation_set_is_built_from_the_first_training_prompts_of_each_task(
    dataset, upstream, tmp_path, per_task
):
    """`rl`: the first samples_per_task training prompts of each task (null: all), never a held-out one."""
    assert build_eval_set(dataset, upstream, tmp_path, split="rl", samples_per_task=per_task) == 0
    _, samples = load_samples(tmp_path / "samples.json")
    by_task: dict[str, list] = {}
    for ref in load_split(dataset, "rl"):  # task-grouped, as the split manifest lists them
        by_task.setdefault(ref.task, []).append(ref)
    expected = [ref for refs in by_task.values() for ref in refs[: per_task or len(refs)]]
    assert [(s.task, s.sample_id) for s in samples] == [(r.task, r.sample_id) for r in expected]
    assert len(samples) == len(TASKS) * (per_task or 2)
    assert not {s.sample_id for s in samples} & {r.sample_id for r in load_split(dataset, "heldout")}
    assert [s.index for s in samples] == list(range(len(samples)))  # a sample's position keys its noise


def test_a_dataset_sample_changed_since_materialize_is_refused(dataset, tmp_path, capsys):
    """A chosen sample's prompt edited after materialize_dataset recorded it: refused naming the file, nothing
    written."""
    copy = Path(shutil.copytree(dataset, tmp_path / "dataset"))
    manifest = materialize_manifest(copy, tmp_path)
    (victim,) = [r for r in load_split(copy, "heldout") if r.task == TASKS[1]]
    (victim.directory / "video/prompt.txt").write_text("an edited prompt\n")
    assert build_eval_set(copy, manifest, tmp_path / "out", split="heldout", samples_per_task=None) == 4
    said = capsys.readouterr().err
    assert f"{victim.directory}: input sample {victim.task}/{victim.sample_id} is not what materialize_dataset" in said
    assert "files that differ: video/prompt.txt" in said
    assert not (tmp_path / "out/samples.json").exists() and not (tmp_path / "out/eval_set.manifest.json").exists()


def test_the_held_out_check_is_always_among_the_cells():
    """Whatever matrix.models and matrix.samplers list: the trained model and (compare_base) the base model under
    the training sampler, once each; a recipe's sampler names its cell."""
    tiny = config.from_dict(trainer_config())
    assert training_sampler(tiny) == "flowcps-0.7" and check_models(tiny) == ("base", "trained")
    product = [(m, s) for m in ("base", "trained") for s in ("unipc", "flowcps-0.7")]
    assert matrix_cells(tiny) == product  # the tiny default's flowcps-0.7 column is its check: no cell twice
    none = config.from_dict(trainer_config(matrix={"models": []}))
    assert matrix_cells(none) == [("base", "flowcps-0.7"), ("trained", "flowcps-0.7")]
    alone = config.from_dict(trainer_config(matrix={"models": ["base"], "samplers": ["euler"], "compare_base": False}))
    assert matrix_cells(alone) == [("base", "euler"), ("trained", "flowcps-0.7")]
    sde = config.from_dict(trainer_config(grpo={"sampler": "dancegrpo", "eta": 0.3}, matrix={"models": []}))
    assert matrix_cells(sde) == [("base", "dancegrpo-0.3"), ("trained", "dancegrpo-0.3")]
    ranged = config.from_dict(trainer_config(grpo={"eta_range": [0.0, 1.0]}))
    assert training_sampler(ranged) == "flowcps-uniform-0.0-1.0"
    assert parse_sampler("flowcps-uniform-0.0-1.0") == Sampler("flowcps", noise_range=(0.0, 1.0))
    assert ("trained", "flowcps-uniform-0.0-1.0") in matrix_cells(ranged)


def test_sampler_names():
    assert parse_sampler("flowcps-0.3").noise == 0.3 and parse_sampler("unipc").kind == "unipc"
    assert parse_sampler("dancegrpo-0.3") == Sampler("dancegrpo", 0.3) and parse_sampler("flowgrpo").noise == 0
    assert parse_sampler("flowcps-uniform-0.2-0.9") == Sampler("flowcps", noise_range=(0.2, 0.9))
    for bad in (
        "flowcps-1.5",
        "ddim",
        "flowcps",
        "dancegrpo-0",
        "dancegrpo",
        "flowcps-uniform-0.9-0.2",
        "flowcps-uniform-0-1.5",
        "flowcps-00.3",  # one name per noise level
        "flowgrpo-0.3",
    ):
        with pytest.raises(Exception, match="matrix.samplers"):
            parse_sampler(bad)
    # The training sampler's cell name reads back as the training's own noise level, exponent or not.
    for eta in (0.7, 1.0, 0.3, 1e-05):
        assert parse_sampler(f"dancegrpo-{number_text(eta)}").noise == eta


@pytest.fixture(scope="module")
def check(tiny_model, dataset, upstream, tmp_path_factory):
    """The held-out check's cells on the held-out evaluation set, generated and scored as the matrix's stages do:
    the base, a 'trained' transformer that is the base one perturbed, and one that is the base unchanged."""
    from diffusers import WanTransformer3DModel

    from videogrpo.evaluation.generate import generate_rank
    from videogrpo.evaluation.score import score_cell

    root = tmp_path_factory.mktemp("check")
    assert build_eval_set(dataset, upstream, root / "evalset", split="heldout", samples_per_task=None) == 0
    tree, samples = load_samples(root / "evalset/samples.json")
    cfg = config.from_dict(trainer_config())
    sampler = training_sampler(cfg)
    weights = {"base": None}
    for name, scale in (("perturbed", 0.2), ("unchanged", 0.0)):
        transformer = WanTransformer3DModel.from_pretrained(tiny_model / "transformer")
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in transformer.parameters():
                p.add_(scale * torch.randn(p.shape, generator=generator))
        transformer.save_pretrained(root / name / "transformer")
        weights[name] = root / name / "transformer"
    scores = {}
    for name, transformer in weights.items():
        videos = root / name / "videos"
        assert generate_rank(0, 1, cfg, tiny_model, transformer, tree, samples, sampler, videos, "cpu") == 3
        table, errors = score_cell(
            cfg, Path(cfg.evalkit.path), tree, root / "evalset/final_frames", samples, videos, root / name / "work"
        )
        assert not errors
        scores[name] = table
    tables = {
        trained: per_task_table(
            {("base", sampler): scores["base"], ("trained", sampler): scores[trained]}, "base", 200, 0
        )
        for trained in ("perturbed", "unchanged")
    }
    return scores, tables


def test_trained_differs_from_base_and_delta_is_trained_minus_base(check):
    scores, tables = check
    table = tables["perturbed"]
    base, trained = (scores[n].set_index("name").score for n in ("base", "perturbed"))
    assert len(base) == 3 and not np.allclose(trained, base)  # one held-out sample per task
    rows = table[table.model == "trained"]
    assert list(rows.task) == [*TASKS, ALL] and list(table.model[:2]) == ["base", "trained"]  # per task, together
    for _, row in rows.iterrows():
        names = scores["base"].name if row.task == ALL else scores["base"].name[scores["base"].task == row.task]
        assert row["mean"] == pytest.approx(trained.loc[names].mean())
        (base_row,) = table[(table.model == "base") & (table.task == row.task)].itertuples()
        assert base_row.mean == pytest.approx(base.loc[names].mean())
        assert row.delta_vs_base == pytest.approx(row["mean"] - base_row.mean)
    overall = rows[rows.task == ALL].iloc[0]
    assert overall.delta_ci_low <= overall.delta_vs_base <= overall.delta_ci_high
    assert overall.se > 0 and overall.samples == 3
    assert overall.se == pytest.approx(trained.std(ddof=1) / np.sqrt(3))


def test_the_base_against_itself_is_a_delta_of_exactly_zero(check):
    scores, tables = check
    assert (scores["unchanged"].score.to_numpy() == scores["base"].score.to_numpy()).all()  # same weights and noise
    trained = tables["unchanged"][tables["unchanged"].model == "trained"]
    assert (trained.delta_vs_base == 0).all()
    overall = trained[trained.task == ALL].iloc[0]  # one sample per task: no interval below ALL
    assert overall.delta_ci_low == overall.delta_ci_high == 0


def test_the_delta_interval_is_a_paired_bootstrap_over_the_same_samples():
    """Scores spread widely over samples, trained = base + 0.05 on every sample: the paired interval is exactly
    [0.05, 0.05] (each sample against itself), where intervals of the two means apart would span tenths; pairs are
    found by sample name, whatever the row order; an uneven change gets the bootstrap of its differences."""
    names = [f"In-Domain_50/t/{i:05d}" for i in range(8)]
    base = pd.DataFrame({"name": names, "domain": "In-Domain_50", "task": "t", "score": np.linspace(0.05, 0.9, 8)})
    shifted = base.assign(score=base.score + 0.05).iloc[::-1]
    table = per_task_table({("base", "s"): base, ("trained", "s"): shifted}, "base", 500, 0)
    overall = table[(table.model == "trained") & (table.task == ALL)].iloc[0]
    assert overall.delta_vs_base == pytest.approx(0.05)
    assert (overall.delta_ci_low, overall.delta_ci_high) == pytest.approx((0.05, 0.05))
    assert overall.ci_high - overall.ci_low > 0.3  # the trained mean alone is uncertain
    deltas = np.array([0.1, -0.2, 0.05, 0.3, 0.0, -0.1, 0.2, 0.15])
    uneven = base.assign(score=base.score + deltas)
    table = per_task_table({("base", "s"): base, ("trained", "s"): uneven}, "base", 500, 0)
    overall = table[(table.model == "trained") & (table.task == ALL)].iloc[0]
    assert (overall.delta_ci_low, overall.delta_ci_high) == pytest.approx(bootstrap_interval(deltas, 500, 0))


def test_a_dancegrpo_cell_samples_with_the_trainings_own_transition(tiny_model, tmp_path):
    """The cell's latents equal the training rollout's (grpo.rollout, DanceGRPO at eta 0.3) from the same noise,
    to the bit: the same transition, the same pinned first frame."""
    from videogrpo.evaluation import generate, sampling
    from videogrpo.evaluation.evalset import EvalSample
    from videogrpo.grpo.draws import seeded_normal
    from videogrpo.grpo.rollout import rollout
    from videogrpo.grpo.samplers import sigma_schedule
    from videogrpo.models.wan import WanTI2V

    cfg = config.from_dict(trainer_config())
    model = WanTI2V.from_config(tiny_model, CPU, cfg)
    s = generate.Settings.from_config(cfg)
    where = _sample_dir(tmp_path, "a red square moves right")
    sample = EvalSample(2, "In-Domain_50", TASKS[0], "00000", "x")
    made = []
    original = sampling.sample_latents
    sampling.sample_latents = lambda *a, **k: made.append(original(*a, **k)) or made[-1]
    try:
        video = generate.generate_video(
            model, model.transformer, tiny_model, where, sample, parse_sampler("dancegrpo-0.3"), s, 5.0
        )
    finally:
        sampling.sample_latents = original
    shape = model.geometry(s.num_frames, s.height, s.width).shape
    embeds, condition = sampling.encode(
        model, ["a red square moves right"], [where / "first_frame.png"], s.height, s.width, s.num_frames
    )
    init = seeded_normal(shape, CPU, s.seed, generate.SEED_TAG, 2).unsqueeze(0)
    trajectory = rollout(
        model,
        model.transformer,
        embeds,
        condition,
        init,
        sigma_schedule(s.steps, 5.0),
        "dancegrpo",
        torch.full((1,), 0.3),
        lambda i: seeded_normal(shape, CPU, s.seed, generate.SEED_TAG, 2, i + 1).unsqueeze(0),
    )
    assert model.trajectory_dtype == torch.float32  # the tiny default stores its rollouts in float32
    torch.testing.assert_close(made[0], trajectory.latents[:, -1], rtol=0, atol=0)
    assert video.shape == (s.num_frames, s.height, s.width, 3)


def test_an_eta_range_cell_draws_each_samples_eta_from_the_range_with_its_seed(tiny_model, tmp_path):
    """flowcps-uniform-0.0-1.0: sample i is the Flow-CPS video at the eta drawn for (seed, i), the same at every
    call, another for another sample, within the range."""
    from videogrpo.evaluation import generate
    from videogrpo.evaluation.evalset import EvalSample
    from videogrpo.models.wan import WanTI2V

    cfg = config.from_dict(trainer_config(grpo={"sampling_steps": 4}))
    model = WanTI2V.from_config(tiny_model, CPU, cfg)
    s = generate.Settings.from_config(cfg)
    where = _sample_dir(tmp_path, "a blue circle fills")
    ranged = parse_sampler("flowcps-uniform-0.0-1.0")
    etas = [generate.sample_eta(ranged, s.seed, index) for index in range(4)]
    assert len(set(etas)) == 4 and all(0 <= eta <= 1 for eta in etas)
    assert etas == [generate.sample_eta(ranged, s.seed, index) for index in range(4)]
    assert etas != [generate.sample_eta(ranged, s.seed + 1, index) for index in range(4)]

    def video(index: int, sampler: Sampler) -> np.ndarray:
        sample = EvalSample(index, "In-Domain_50", TASKS[0], "00000", "x")
        return generate.generate_video(model, model.transformer, tiny_model, where, sample, sampler, s, 5.0)

    for index in (0, 1):
        drawn = video(index, ranged)
        assert np.array_equal(drawn, video(index, Sampler("flowcps", etas[index])))
        assert not np.array_equal(drawn, video(index, Sampler("flowcps", etas[1 - index])))


def _sample_dir(root: Path, prompt: str) -> Path:
    from PIL import Image

    where = root / "sample"
    where.mkdir(parents=True)
    (where / "prompt.txt").write_text(prompt + "\n")
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(image).save(where / "first_frame.png")
    return where


def test_the_report_shows_the_check_rows_of_the_per_task_csv_as_they_are(check, tmp_path):
    from videogrpo.provenance.report_page import render_html

    _, tables = check
    tables["perturbed"].to_csv(tmp_path / "per_task.csv", index=False)
    with open(tmp_path / "per_task.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    page = render_html(_provenance(), [], rows, None, None, "flowcps-0.7")
    assert "No training metrics were recorded" in page and "Reward during training" not in page
    assert "Held-out check: trained against base under the training sampler (<code>flowcps-0.7</code>)" in page
    (shown,) = [t for t in report_tables(page) if t[0][:2] == ["task", "samples"]]
    assert shown[0] == ["task", "samples", "base", "trained", "trained - base [95 % paired interval]"]
    assert [line[0] for line in shown[1:]] == [*TASKS, ALL]  # per task, the models side by side
    assert_check_shows_csv(shown, rows)


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
    from videogrpo.provenance.page_cells import fixed
    from videogrpo.provenance.report_page import render_html

    assert [fixed(v) for v in (-2.9e-05, -0.0, 2.9e-05, -0.00009, -0.0009)] == [
        "0.0000",
        "0.0000",
        "0.0000",
        "-0.0001",
        "-0.0009",
    ]
    assert fixed(-0.0004, 3) == "0.000" and fixed(float("nan")) == "nan"
    row = {
        "model": "trained",
        "sampler": "flowcps-0.7",
        "domain": "overall",
        "task": "ALL",
        "samples": "6",
        "mean": "0.3",
        "se": "0.01",
        "delta_vs_base": "-2.9000502486220547e-05",
        "delta_ci_low": "-6.4e-05",
        "delta_ci_high": "",
    }
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
    assert evaluation[1] == ["ALL", "6", "0.3000 ± 0.0100", "0.0000 [-0.0001, –]"]
    (pivot,) = [t for t in tables if t[0] == ["model", "unipc"]]
    assert pivot[1] == ["trained", "0.300 [0.000, 1.000]"]


def test_the_learning_rate_column_shows_the_warm_up_and_the_decay():
    from videogrpo.grpo.lr_schedule import learning_rate
    from videogrpo.provenance.page_cells import learning_rate_text
    from videogrpo.provenance.report_page import render_html

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


def test_the_videos_pair_base_and_trained_of_the_same_sample(tmp_path):
    from videogrpo.provenance.report_page import render_html, video_pairs
    from videogrpo.stages.report import check_videos

    tasks = ["S-1_move", "S-2_fill"]
    cells = {
        "base": "results/matrix/k/base-tiny/flowcps-0.7/prepared",
        "trained": "results/matrix/k/run/flowcps-0.7/prepared",
    }

    def entries(samples: list[str]) -> dict:
        return {f"In-Domain_50/{task}/{s}.mp4": ["0" * 64, 1] for task in tasks for s in samples}

    # The check's cells by their score_cell manifests: the videos as scored (another sampler's cell is not the check's).
    provenance = {
        "stages": {
            f"score_cell:{model}:{sampler}": {"outputs": {"prepared": {"path": cells[model], "entries": entries(made)}}}
            for model, sampler, made in (
                ("base", "flowcps-0.7", ["00001", "00002", "00003"]),
                ("trained", "flowcps-0.7", ["00003", "00001"]),
                ("trained", "euler", ["00000"]),
            )
        }
    }
    videos = check_videos(provenance, ("base", "trained"), "flowcps-0.7", Path("results/runs/run/report/report.html"))
    # Sorted paths put every base video first: the old page showed two base videos per task.
    pairs, total = video_pairs(videos)
    assert total == 4 and [(task, sample) for task, sample, _, _ in pairs] == [
        (task, s) for task in tasks for s in ("00001", "00003")
    ]
    for task, sample, base, trained in pairs:
        assert base == f"../../../matrix/k/base-tiny/flowcps-0.7/prepared/In-Domain_50/{task}/{sample}.mp4"
        assert trained == f"../../../matrix/k/run/flowcps-0.7/prepared/In-Domain_50/{task}/{sample}.mp4"
    check = [{"model": m, "task": "ALL", "samples": "4", "mean": "0.5", "se": "0.1"} for m in ("base", "trained")]
    page = render_html(_provenance(), [], check, videos)
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
    # Broken only after an underscore: never inside `G-134` or `data-generator`, never a line ending in '-'.
    titles = [ax.get_title() for ax in shown if not ax.get_title().startswith("x")]
    assert all("data-generator" in t and not re.search(r"-\n", t) for t in titles if len(t) > 3), titles
    assert all(line.endswith("_") for t in titles for line in t.split("\n")[:-1]), titles
    boxes = [ax.title.get_window_extent(renderer) for ax in shown]
    width, height = fig.canvas.get_width_height()
    for k, box in enumerate(boxes):
        assert 0 <= box.x0 and box.x1 <= width and box.y1 <= height, (shown[k].get_title(), box)
        for other in boxes[k + 1 :]:  # no title runs into another panel's title
            assert box.x1 <= other.x0 or other.x1 <= box.x0 or box.y1 <= other.y0 or other.y1 <= box.y0


def test_a_matrix_where_a_model_lacks_a_sampler_renders_the_cells_it_has():
    """matrix.models [base] with three samplers: the run's check adds only trained under the training sampler, so
    the trained row has one cell. The plot draws no bar where there is no cell; the table shows a dash there."""
    from videogrpo.provenance.report_page import _matrix_pivot, matrix_png

    def row(model: str, sampler: str, mean: str) -> dict:
        return {
            "model": model,
            "sampler": sampler,
            "domain": "overall",
            "mean": mean,
            "ci_low": "0.1",
            "ci_high": "0.9",
        }

    matrix = [row("base", "unipc", "0.4"), row("base", "flowcps-0.7", "0.5"), row("trained", "flowcps-0.7", "0.6")]
    assert matrix_png(matrix)  # a PNG, not a KeyError for trained under unipc
    pivot, columns = _matrix_pivot(matrix)
    assert columns == ["model", "unipc", "flowcps-0.7"]
    assert pivot[1] == {"model": "trained", "unipc": "–", "flowcps-0.7": "0.600 [0.100, 0.900]"}


def test_the_first_screen_is_the_verdict_the_recipe_and_the_run_status():
    from videogrpo.provenance.report_page import render_html, run_status, verdict_rows

    def row(model, domain, mean, delta=("", "", "")):
        keys = ("delta_vs_base", "delta_ci_low", "delta_ci_high")
        return {"model": model, "sampler": "flowcps-0.7", "domain": domain, "samples": "6", "mean": mean,
                "se": "0.01", "ci_low": "0.0", "ci_high": "0.95", **dict(zip(keys, delta))}  # fmt: skip

    matrix = [
        row("base", "In-Domain_50", "0.30"),
        row("trained", "In-Domain_50", "0.40", ("0.1", "0.05", "0.15")),
        row("base", "overall", "0.35"),
        row("trained", "overall", "0.34", ("-0.01", "-0.03", "0.01")),
        row("trained", "Out-of-Domain_50", "0.2", ("-0.1", "-0.2", "-0.05")),
        {**row("trained", "overall", "0.9", ("0.5", "0.4", "0.6")), "sampler": "euler"},  # not the check's
    ]
    verdict = verdict_rows(matrix, "flowcps-0.7")
    assert [(r["domain"], r["trained"], r["base"], r["verdict"]) for r in verdict] == [
        ("overall", "0.3400", "0.3500", "no clear difference (the interval holds 0)"),
        ("In-Domain_50", "0.4000", "0.3000", "better"),
        ("Out-of-Domain_50", "0.2000", "–", "worse"),
    ]
    jobs = [{"stage": "train", "state": "COMPLETED"}, {"stage": "generate_cell", "state": "TIMEOUT"}]
    assert run_status({"cost": {"jobs": jobs}}) == (
        "1 of 2 stage jobs did not complete: generate_cell (TIMEOUT)",
        False,
    )
    config = {"recipe": "rl_x", "grpo": {"sampler": "flowcps", "eta": 0.7, "group_size": 32, "prompts_per_step": 32}}
    assert run_status({"cost": {"jobs": jobs[:1]}}) == (
        "complete: the 1 stage jobs before this report all completed",
        True,
    )
    provenance = dict(_provenance(), config=config)
    page = render_html(
        provenance, [{"step": 1, "reward_mean": 0.3, "reward_std": 0.1}], [], None, matrix, "flowcps-0.7"
    )
    first = page.split("<h2>")[0]  # everything above the first section: the first screen
    assert "Run status: no stage job recorded its cost." in first
    assert "recipe <b>rl_x</b>" in first and "sampler flowcps, eta 0.7" in first and "32 prompts x group 32" in first
    assert "no clear difference" in first and "better" in first and "1 updates" in first
