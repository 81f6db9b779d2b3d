"""Preparation and scoring of one matrix cell with the reward's own code.

Each generated video is prepared as the reward prepares a rollout (scale to fit without cropping, pad,
every frame kept, fps raised for the release evaluation's duration cap `matrix.max_seconds`:
`rewards.scoring.score_one`) and scored by the EvalKit
in the CPU scorer pool (workers in the checkout, CUDA hidden, thread limits). Every sample's result,
error included, is kept as one record in the work directory, so an interrupted scoring resumes and a
failed one shows every error; the caller promotes a score file only when the set is exact and no
record holds an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from videogrpo import atomic
from videogrpo.config.identity import generation_settings
from videogrpo.data.video import playback_fps, read_video, video_problem
from videogrpo.errors import VideoGRPOError
from videogrpo.evaluation.evalset import EvalSample
from videogrpo.progress import Progress
from videogrpo.rewards.rule import RuleScorer, score_request


class ScoringFailed(VideoGRPOError):
    """The cell's scores hold errors; every record stays in the work directory."""


def gt_for(tree: Path, final_frames: Path, sample: EvalSample) -> dict:
    """The EvalKit's ground-truth description of a flattened sample (its final frame taken from the video)."""
    root = (tree / sample.name).resolve()
    return {
        "gt_video_path": str(root / "ground_truth.mp4"),
        "gt_first_frame": str(root / "first_frame.png"),
        "gt_final_frame": str((final_frames / f"{sample.name}.png").resolve()),
        "prompt": (root / "prompt.txt").read_text(encoding="utf-8"),
        "gt_path": str(root),
        "metafile_path": [str(root / "metadata.json")],
    }


def _record_ok(record_path: Path, prepared: Path, frames: int, side: int, fps: int) -> bool:
    """A record kept from an earlier attempt is reused only when it holds a score: an error is scored again."""
    if not record_path.is_file() or json.loads(record_path.read_text()).get("error"):
        return False
    return video_problem(prepared, frames, side, side, fps) is None


def sample_work(work: Path, name: str) -> tuple[Path, Path]:
    """A sample's record and prepared video in the work directory."""
    return work / "records" / f"{name}.json", work / "prepared" / f"{name}.mp4"


# evalkit.fail_on_error is training's choice (stop the run, or count the failure in reward_errors); evaluation
# has its own, and its warning must say so rather than report the config field as false.
SCORE_CELL_POLICY = (
    "recorded, whatever evalkit.fail_on_error says: score_cell scores every sample of the cell first, so that it "
    "fails the cell once, naming each failed sample, and writes no score file for a cell with one"
)


def score_cell(cfg, evalkit: Path, tree: Path, final_frames: Path, samples: list[EvalSample], videos: Path, work: Path):
    """Score every video of the cell; returns (scores, errors): one row per sample, and the records with an
    error. Records and prepared videos accumulate in `work` (records/, prepared/)."""
    e = cfg.evalkit
    generated = generation_settings(cfg)
    frames = generated["num_frames"]
    fps = playback_fps(frames, generated["fps"], cfg.matrix.max_seconds)

    def paths(sample: EvalSample) -> tuple[Path, Path]:
        return sample_work(work, sample.name)

    todo = [s for s in samples if not _record_ok(*paths(s), frames, e.video_size, fps)]
    progress = Progress("score", total=len(samples), unit="videos")
    progress.update(len(samples) - len(todo))
    if todo:
        # Errors are collected, not raised at the first: the caller refuses the cell naming every one.
        with RuleScorer.for_config(cfg, evalkit, fail_on_error=False, policy=SCORE_CELL_POLICY) as scorer:
            print(f"scoring with {e.workers} scorer workers (evalkit.workers)", flush=True)
            pending = []
            for sample in todo:
                record_path, keep = paths(sample)
                keep.parent.mkdir(parents=True, exist_ok=True)
                request = score_request(
                    e,
                    generated["fps"],
                    read_video(videos / f"{sample.name}.mp4"),
                    sample.task,
                    str(tree / sample.name),
                    str(keep),
                    cfg.matrix.max_seconds,
                )
                request.gt = gt_for(tree, final_frames, sample)
                pending.append((sample, scorer.submit(request)))
            for sample, future in pending:
                (result,) = scorer.collect([future])
                error = result.get("error") or ""
                if result.get("unsupported"):
                    error = f"the EvalKit has no evaluator for task {sample.task}"
                record_path, keep = paths(sample)
                if not error and (why := video_problem(keep, frames, e.video_size, e.video_size, fps)):
                    error = f"the prepared video {keep} failed validation: {why}"
                record = {**sample.to_dict(), "name": sample.name, "score": result["score"], "error": error}
                record["dimensions"] = result.get("dimensions", {})
                atomic.write_json(record_path, record)
                progress.update()
    progress.finish()
    rows = [json.loads(paths(s)[0].read_text()) for s in samples]
    errors = [r for r in rows if r["error"]]
    dimensions = sorted({k for r in rows for k in r["dimensions"]})
    table = pd.DataFrame(
        [
            {
                **{k: r[k] for k in ("name", "domain", "task", "sample", "sample_id", "score")},
                **{f"dim_{k}": r["dimensions"].get(k) for k in dimensions},
            }
            for r in rows
        ]
    )
    return table, errors
