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
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo.errors import VideoGRPOError
from videogrpo.rewards.evalkit import run_probe, runtime_problems

_EVALKIT = None
_START_ERROR: str | None = None  # why this worker could not start: reported with the first request, not lost


def _init_worker(evalkit_path: str, threads: int, easyocr_models: str, contract: dict[str, str]) -> None:
    """Set a scorer process up as the reference does: in the checkout, CUDA hidden, runtime checked again."""
    global _EVALKIT, _START_ERROR
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle: it closes the pool
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # EasyOCR opens GPU readers whenever CUDA is visible
    os.environ["EASYOCR_MODULE_PATH"] = os.path.join(evalkit_path, easyocr_models)
    try:
        os.chdir(evalkit_path)  # compatibility revisions read ./easyocr_models and annotations/ from here
        problems = runtime_problems(contract, run_probe(contract))
        if problems:
            raise VideoGRPOError("the scorer runtime breaks evalkit.runtime: " + "; ".join(problems))
        sys.path.insert(0, evalkit_path)
        import run_evaluation
        from vbvr_bench.evaluators import TASK_EVALUATOR_MAP

        _EVALKIT = (run_evaluation, TASK_EVALUATOR_MAP)
    except BaseException as err:  # noqa: BLE001 - any failure here must reach the parent with its cause
        lines = traceback.format_exception_only(type(err), err)
        _START_ERROR = "".join(lines).strip()


def _worker_ready() -> str | None:
    return _START_ERROR


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
    gt: dict | None = None
    """The EvalKit's ground-truth description (None: that of a dataset sample directory, `gt_info`)."""

    def __post_init__(self) -> None:
        # Made here, in the driver: the workers run in the checkout, where relative paths would point.
        self.sample_dir = os.path.abspath(self.sample_dir)
        self.keep_video = os.path.abspath(self.keep_video) if self.keep_video else None


def score_request(
    evalkit,
    fps: int,
    frames: np.ndarray,
    task: str,
    sample_dir: str,
    keep_video: str | None = None,
    max_seconds: float | None = None,
) -> ScoreRequest:
    """A request with the scorer settings of the `evalkit` config section (`max_seconds` overrides its duration
    cap: evaluation scores with the release evaluation's own, matrix.max_seconds)."""
    return ScoreRequest(
        frames,
        task,
        sample_dir,
        fps,
        evalkit.video_size,
        evalkit.max_seconds if max_seconds is None else max_seconds,
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

    if _START_ERROR is not None:
        raise ScorerStartError(f"a scorer worker could not start in the EvalKit checkout: {_START_ERROR}")
    run_evaluation, evaluator_map = _EVALKIT
    if request.task not in evaluator_map:
        return {"score": request.unsupported_score, "dimensions": {}, "unsupported": request.task}
    fps = playback_fps(len(request.frames), request.fps, request.max_seconds)
    frames = fit_square(request.frames, request.video_size)
    with tempfile.TemporaryDirectory() as tmp:
        path = request.keep_video or os.path.join(tmp, "generated.mp4")
        write_mp4(path, frames, fps=fps, crf=request.crf)
        gt = request.gt or gt_info(request.sample_dir)
        result = run_evaluation.evaluate_single_video(path, request.task, gt, device="cpu")
    score = result.get("score")
    if not isinstance(score, (int, float)) or not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise VideoGRPOError(
            f"EvalKit returned score {score!r} for task {request.task} ({request.sample_dir}); "
            f"the contract is a finite score in [0, 1]"
        )
    return {
        "score": float(score),
        "dimensions": result.get("dimensions", {}),
        "error": result.get("error"),
        "task": request.task,
        "sample": request.sample_dir,
    }


@contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Scorer processes are started on demand by submit(); started with SIGINT ignored, they ignore it from their
    first instruction (an ignored signal stays ignored across exec, and Python keeps it so), not only once
    their initializer has run: a Ctrl-C while one is still importing must not print its traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def warn_once(warned: set[str], key: str, message: str) -> None:
    """One warning per key (a task) for the whole run, not one per video."""
    if key not in warned:
        warned.add(key)
        print(f"warning: {message}", file=sys.stderr, flush=True)


class ScorerStartError(VideoGRPOError):
    """A scorer process could not import or check the EvalKit: the cause, not a bare BrokenProcessPool."""


class EvaluatorError(VideoGRPOError):
    """An evaluator returned `error` while evalkit.fail_on_error is true."""


class RuleScorer:
    """A pool of scorer processes, each started in the EvalKit checkout with the checkout importable.

    `collect` applies evalkit.fail_on_error: an evaluator error stops the run naming the task, the sample and
    the message, or scores 0 with one warning per task (the caller counts them as `reward_errors`).
    """

    def __init__(
        self,
        evalkit_path: str | Path,
        workers: int,
        threads_per_worker: int,
        fail_on_error: bool = True,
        easyocr_models: str = "easyocr_models",
        runtime: dict[str, str] | None = None,
        python: str = "",
    ):
        self.evalkit_path = str(Path(evalkit_path).resolve())
        context = multiprocessing.get_context("spawn")
        # The scorer's own environment (evalkit.python, with videogrpo installed --no-deps), or this one.
        # multiprocessing keeps one spawn executable per process: always set it, never inherit another's.
        context.set_executable(python or sys.executable)
        self.fail_on_error = fail_on_error
        self.warned: set[str] = set()
        # spawn: the training process holds torch threads and maybe CUDA, which must not be forked.
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(self.evalkit_path, threads_per_worker, easyocr_models, runtime or {}),
        )
        try:
            with _children_ignore_sigint():
                ready = self.pool.submit(_worker_ready)
            started = ready.result()
        except BrokenProcessPool as err:
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise ScorerStartError(f"the scorer processes died while starting in {self.evalkit_path} ({err})") from None
        if started is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise ScorerStartError(
                f"a scorer worker could not start in the EvalKit checkout {self.evalkit_path}: {started}\n"
                f"Check evalkit.path, and that the scorer environment has the packages of evalkit.runtime."
            )

    def submit(self, request: ScoreRequest) -> Future:
        with _children_ignore_sigint():
            return self.pool.submit(score_one, request)

    def collect(self, futures: list[Future]) -> list[dict]:
        try:
            results = [f.result() for f in futures]
        except BrokenProcessPool as err:
            raise ScorerStartError(f"a scorer process died ({err}); its log lines above say why") from None
        for r in results:
            if r.get("unsupported"):
                warn_once(
                    self.warned,
                    r["unsupported"],
                    f"task {r['unsupported']} is unknown to the EvalKit: scored evalkit.unsupported_score "
                    f"= {r['score']}",
                )
            elif r.get("error"):
                if self.fail_on_error:
                    raise EvaluatorError(
                        f"the EvalKit evaluator of task {r['task']} failed on {r['sample']}: {r['error']}\n"
                        f"evalkit.fail_on_error is true, so the run stops: fix the evaluator or the sample, or set "
                        f"evalkit.fail_on_error: false to score such rollouts 0 (counted in reward_errors)."
                    )
                r["score"] = 0.0
                warn_once(
                    self.warned,
                    r["task"],
                    f"the EvalKit evaluator of task {r['task']} failed ({r['error']}); scored 0 and counted in "
                    f"reward_errors (evalkit.fail_on_error is false); further failures of this task are not repeated",
                )
        return results

    @classmethod
    def for_config(cls, cfg, evalkit_path: str | Path, fail_on_error: bool | None = None) -> RuleScorer:
        """The scorer the `evalkit` config section describes (`fail_on_error` overrides evalkit.fail_on_error)."""
        from videogrpo.config import runtime_contract

        e = cfg.evalkit
        return cls(
            evalkit_path,
            e.workers,
            e.threads_per_worker,
            e.fail_on_error if fail_on_error is None else fail_on_error,
            e.easyocr_models,
            runtime_contract(cfg),
            e.python,
        )

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RuleScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
