"""Evaluation: sample the configured split with the trained transformer (and the base one), score, tabulate.

The samples come from `evaluate.split`: the held-out part of the dataset (the tiny default), or the
first samples of each task among the training prompts, sampled with fresh noise (the recipes train
on every sample; the reference's separate evaluation set is issue 11's).

Both variants see the same samples and the same noise (seeded by sample, not by order), so the
per-task difference measures training, not sampling luck.

Both model kinds (`videogrpo.evaluation.sampling`): TI2V samples with the training rollout itself; I2V-A14B with
sampling's SDE loop (nothing pinned, steps routed to the experts by the model's boundary), its trained
variant the base pipeline with the exported expert folder(s) substituted. The base is sampled first: an
I2V base expert is let go before its trained replacement loads.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from videogrpo import atomic
from videogrpo.config import Config
from videogrpo.data.dataset import SampleRef, load_split
from videogrpo.errors import ConfigError
from videogrpo.evaluation import sampling
from videogrpo.evaluation.aggregate import bootstrap_interval
from videogrpo.grpo.rollout import rollout, seeded_normal
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.models.wan import flow_shift
from videogrpo.progress import Progress
from videogrpo.rewards.rule import RuleScorer, score_request

BATCH = 4
SEED_TAG = 0xE7A1


def evaluation_samples(dataset: Path, split: str, max_per_task: int | None) -> list[SampleRef]:
    """The first max_per_task samples of each task in `split` (task-grouped order)."""
    samples = load_split(dataset, split)
    if not samples:
        raise ConfigError(
            f"{dataset}: the {split!r} split is empty (evaluate.split = {split!r}); hold samples out "
            f"with data.heldout_per_task or evaluate the 'rl' split"
        )
    if max_per_task is None:
        return samples
    kept, seen = [], {}
    for s in samples:
        seen[s.task] = seen.get(s.task, 0) + 1
        if seen[s.task] <= max_per_task:
            kept.append(s)
    return kept


@torch.no_grad()
def sample_batch(cfg: Config, model, transformer, samples: list[SampleRef], first: int):
    """Videos (uint8 [B, F, H, W, 3]) of samples[first : first + BATCH], noise seeded by each sample's position.

    `transformer`: what the model's velocity takes (a TI2V transformer, or an I2V model's experts mapping)."""
    e = cfg.evaluate
    sigmas = sigma_schedule(e.sampling_steps or cfg.grpo.sampling_steps, flow_shift(cfg, model.model_dir)[0])
    shape = model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width).shape
    dev = model.device
    batch = samples[first : first + BATCH]
    keys = [first + i for i in range(len(batch))]
    embeds, condition = sampling.encode(
        model,
        [s.prompt for s in batch],
        [s.first_frame for s in batch],
        cfg.video.height,
        cfg.video.width,
        cfg.video.num_frames,
    )
    init = torch.stack([seeded_normal(shape, dev, e.seed, SEED_TAG, k) for k in keys])

    def step_noise(i: int) -> torch.Tensor:
        return torch.stack([seeded_normal(shape, dev, e.seed, SEED_TAG, k, i + 1) for k in keys])

    etas = torch.full((len(batch),), e.eta, device=dev)
    if not sampling.is_i2v(model):
        trajectory = rollout(model, transformer, embeds, condition, init, sigmas, e.sampler, etas, step_noise)
        return model.decode(trajectory.latents[:, -1])
    how = sampling.SDE(e.sampler, sigmas, etas, step_noise)
    return model.decode(
        sampling.sample_latents(model, transformer, embeds, condition, init, how, dtype=model.trajectory_dtype)
    )


class BatchRecords:
    """Scored batches of one variant in `root`: one JSON per batch, written (atomically) once its scores are
    in, with its videos beside it. An interrupted evaluation reruns only the batches without a complete record,
    in the same batches and with the same noise, so it ends exactly where an uninterrupted one would."""

    def __init__(self, root: Path, scorer: RuleScorer):
        self.root = root
        self.scorer = scorer
        self.pending: list[tuple[int, list[tuple[SampleRef, object]]]] = []

    def path(self, first: int) -> Path:
        return self.root / f"batch-{first:06d}.json"

    def video(self, sample: SampleRef) -> Path:
        return self.root / "videos" / sample.task / f"{sample.sample_id}.mp4"

    def done(self, first: int) -> bool:
        """A batch is kept only when every sample of it scored: an error (scored 0 under fail_on_error: false)
        is scored again by the next attempt, never re-emitted."""
        path = self.path(first)
        return path.is_file() and not any(row["error"] for row in json.loads(path.read_text()))

    def submit(self, first: int, futures: list[tuple[SampleRef, object]]) -> None:
        self.pending.append((first, futures))
        self._write(wait=False)

    def _write(self, wait: bool) -> None:
        still = []
        for first, futures in self.pending:
            if not wait and not all(f.done() for _, f in futures):
                still.append((first, futures))
                continue
            results = self.scorer.collect([f for _, f in futures])
            rows = [
                {
                    "task": s.task,
                    "sample_id": s.sample_id,
                    "score": r["score"],
                    "error": r.get("error") or "",  # an evaluator failure scored 0 (evalkit.fail_on_error: false)
                    **{f"dim_{k}": v for k, v in r["dimensions"].items()},
                }
                for (s, _), r in zip(futures, results)
            ]
            atomic.write_json(self.path(first), rows)
        self.pending = still

    def rows(self, firsts: list[int]) -> list[dict]:
        self._write(wait=True)
        return [row for first in firsts for row in json.loads(self.path(first).read_text())]


def evaluate(
    cfg: Config,
    model_dir: Path,
    final_dir: Path,
    dataset: Path,
    evalkit: Path,
    videos_dir: Path,
    device: torch.device,
    records: Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Score the evaluation samples, keeping each scored video under videos_dir; returns (scores, per-task table).

    `records` (default: beside videos_dir) holds each scored batch; batches recorded there by an earlier,
    interrupted call are not generated again.
    """
    samples = evaluation_samples(dataset, cfg.evaluate.split, cfg.evaluate.max_samples_per_task)
    model = sampling.load_model(cfg, model_dir, device)
    if sampling.is_i2v(model):
        sampling.exported_folders(cfg, final_dir)  # refused before any video is made, not after the base's
    variants = {"trained": lambda: sampling.trained_weights(cfg, model, final_dir)}
    if cfg.evaluate.compare_base:  # first: the trained I2V experts replace the base ones in place
        variants = {"base": lambda: sampling.base_weights(model), **variants}
    firsts = list(range(0, len(samples), BATCH))
    records = records or videos_dir.parent / f".{videos_dir.name}.records"
    rows = []
    with RuleScorer.for_config(cfg, evalkit) as scorer:
        print(f"scoring with {cfg.evalkit.workers} scorer workers (evalkit.workers)", flush=True)
        for variant, load in variants.items():
            kept = BatchRecords(records / variant, scorer)
            todo = [first for first in firsts if not kept.done(first)]
            print(f"evaluate {variant}: {len(firsts) - len(todo)} of {len(firsts)} batches kept", flush=True)
            progress = Progress(f"evaluate {variant}", total=len(samples), unit="videos")
            progress.update(len(samples) - sum(len(samples[f : f + BATCH]) for f in todo))
            transformer = None  # the previous variant's weights are let go before these load
            transformer = sampling.eval_mode(load()) if todo else None
            for first in todo:
                futures = []
                for sample, video in zip(
                    samples[first : first + BATCH], sample_batch(cfg, model, transformer, samples, first)
                ):
                    keep = kept.video(sample)
                    keep.parent.mkdir(parents=True, exist_ok=True)
                    request = score_request(
                        cfg.evalkit,
                        cfg.video.fps,
                        video,
                        sample.task,
                        str(sample.directory),
                        str(keep),
                        cfg.matrix.max_seconds,
                    )
                    futures.append((sample, scorer.submit(request)))
                    progress.update()
                kept.submit(first, futures)
            rows += [dict(row, variant=variant) for row in kept.rows(firsts)]
            shutil.copytree(records / variant / "videos", videos_dir / variant, dirs_exist_ok=True)
            progress.finish()
    dimensions = sorted({key for row in rows for key in row if key.startswith("dim_")})
    scores = pd.DataFrame(rows)[["variant", "task", "sample_id", "score", "error", *dimensions]]
    return scores, per_task_table(scores, cfg.matrix.bootstrap, cfg.evaluate.seed)


def per_task_table(scores: pd.DataFrame, resamples: int, seed: int = 0) -> pd.DataFrame:
    """Per task and over ALL samples: each variant's mean score and standard error, and (with a base) the
    trained - base difference with a 95 % paired bootstrap interval (the same samples and noise per pair)."""

    def summarise(frame: pd.DataFrame) -> dict:
        by_variant = {
            variant: part.set_index(["task", "sample_id"]).score for variant, part in frame.groupby("variant")
        }
        row: dict = {"samples": len(by_variant["trained"])}
        for variant, values in sorted(by_variant.items()):
            row[f"{variant}_score"] = float(values.mean())
            row[f"{variant}_se"] = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
        if "base" in by_variant:
            deltas = (by_variant["trained"] - by_variant["base"].reindex(by_variant["trained"].index)).to_numpy()
            row["delta"] = float(deltas.mean())
            row["delta_ci_low"], row["delta_ci_high"] = bootstrap_interval(deltas, resamples, seed)
        return row

    rows = [{"task": task, **summarise(frame)} for task, frame in scores.groupby("task", sort=True)]
    rows.append({"task": "ALL", **summarise(scores)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False), file=sys.stderr)
    return table
