"""The rule reward: the pinned EvalKit's evaluators, called in a CPU process pool, submit now, collect later.

Per sample a worker writes the generated video the way the EvalKit expects it (every frame kept,
resized with Lanczos and padded to a square, the frame rate raised to fit the duration cap, x264 at a
fixed CRF), calls
`run_evaluation.evaluate_single_video(..., device="cpu")` from the checkout, and checks the contract:
a finite score in [0, 1]. Tasks the EvalKit does not know score `unsupported_score` with a warning.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
import tempfile
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo.errors import VideoGRPOError

_EVALKIT = None


def _init_worker(evalkit_path: str, threads: int) -> None:
    global _EVALKIT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle: it closes the pool
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    sys.path.insert(0, evalkit_path)
    import run_evaluation
    from vbvr_bench.evaluators import TASK_EVALUATOR_MAP

    _EVALKIT = (run_evaluation, TASK_EVALUATOR_MAP)


@dataclass
class ScoreRequest:
    frames: np.ndarray
    """Generated video, uint8 [F, H, W, 3]."""
    task: str
    sample_dir: str
    fps: int
    video_size: int
    max_seconds: float
    crf: int
    unsupported_score: float
    keep_video: str | None = None
    """Where to keep the MP4 handed to the scorer (None: a temporary file)."""


def score_request(
    evalkit, fps: int, frames: np.ndarray, task: str, sample_dir: str, keep_video: str | None = None
) -> ScoreRequest:
    """A request with the scorer settings of the `evalkit` config section."""
    return ScoreRequest(
        frames,
        task,
        sample_dir,
        fps,
        evalkit.video_size,
        evalkit.max_seconds,
        evalkit.crf,
        evalkit.unsupported_score,
        keep_video,
    )


def gt_info(sample_dir: str) -> dict:
    root = Path(sample_dir)
    return {
        "gt_video_path": str(root / "video/ground_truth.mp4"),
        "gt_first_frame": str(root / "first_frame.png"),
        "gt_final_frame": str(root / "video/final_frame.png"),
        "prompt": (root / "video/prompt.txt").read_text(encoding="utf-8"),
        "gt_path": str(root),
        "metafile_path": [str(root / "metadata.json")],
    }


def score_one(request: ScoreRequest) -> dict:
    """Runs in a scorer process: write the video, call the EvalKit, enforce the score contract."""
    from videogrpo.data.video import fit_square, playback_fps, write_mp4

    run_evaluation, evaluator_map = _EVALKIT
    if request.task not in evaluator_map:
        return {"score": request.unsupported_score, "dimensions": {}, "unsupported": request.task}
    fps = playback_fps(len(request.frames), request.fps, request.max_seconds)
    frames = fit_square(request.frames, request.video_size)
    with tempfile.TemporaryDirectory() as tmp:
        path = request.keep_video or os.path.join(tmp, "generated.mp4")
        write_mp4(path, frames, fps=fps, crf=request.crf)
        result = run_evaluation.evaluate_single_video(path, request.task, gt_info(request.sample_dir), device="cpu")
    score = result.get("score")
    if not isinstance(score, (int, float)) or not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise VideoGRPOError(
            f"EvalKit returned score {score!r} for task {request.task} ({request.sample_dir}); "
            f"the contract is a finite score in [0, 1]"
        )
    return {"score": float(score), "dimensions": result.get("dimensions", {}), "error": result.get("error")}


class RuleScorer:
    """A pool of scorer processes with the EvalKit checkout importable in each."""

    def __init__(self, evalkit_path: str | Path, workers: int, threads_per_worker: int):
        self.evalkit_path = str(Path(evalkit_path).resolve())
        # spawn: the training process holds torch threads and maybe CUDA, which must not be forked.
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.evalkit_path, threads_per_worker),
        )

    def submit(self, request: ScoreRequest) -> Future:
        return self.pool.submit(score_one, request)

    @staticmethod
    def collect(futures: list[Future]) -> list[dict]:
        results = [f.result() for f in futures]
        for r in results:
            if r.get("unsupported"):
                warnings.warn(
                    f"task {r['unsupported']} is unknown to the EvalKit: scored evalkit.unsupported_score "
                    f"= {r['score']}",
                    stacklevel=2,
                )
            elif r.get("error"):
                print(f"warning: EvalKit evaluator failed, score 0: {r['error']}", file=sys.stderr)
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RuleScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
