"""Runs in a scorer process: one request scored by the pinned EvalKit, and the score contract.

Per sample: the generated video written the way the EvalKit expects it (every frame kept, resized with
Lanczos and padded to a square, the frame rate raised to fit the duration cap, x264 at a fixed CRF),
`run_evaluation.evaluate_single_video(..., device="cpu")` called from the checkout, and a finite real score
in [0, 1] required. What fails for one sample comes back as that sample's error.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import tempfile
import traceback

import numpy as np

from videogrpo.errors import disk_full_message
from videogrpo.rewards.request import ScoreRequest, gt_info


def plain(value):
    """An evaluator's dimensions as plain Python values (numpy scalars and arrays too; anything else by its repr),
    so that the driver unpickles them whatever its numpy, and records serialise them as JSON."""
    if isinstance(value, np.generic):  # first: numpy.float64 is also a float
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return repr(value)


def contract_score(value) -> float | None:
    """The score as a float when it keeps the contract: any real number type (numpy's too; not a bool, which is
    no score), finite, in [0, 1]; else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    score = float(value)
    return score if math.isfinite(score) and 0.0 <= score <= 1.0 else None


# The ground-truth files the EvalKit is handed, by their gt_info key. The public EvalKit loads a missing PNG or MP4
# as None and scores the sample anyway, reporting no error (measured on 275472f: 0.0 for a missing first or final
# frame, 1.0 for a missing ground-truth video under a task that does not read it): each is checked here instead.
GROUND_TRUTH_FILES = {
    "gt_first_frame": "first frame",
    "gt_final_frame": "final frame",
    "gt_video_path": "ground-truth video",
}


def missing_ground_truth(gt: dict) -> str | None:
    """Why the sample cannot be scored when a ground-truth file the EvalKit reads is missing (naming each), or None."""
    missing = [f"{gt[key]} ({what}, {key})" for key, what in GROUND_TRUTH_FILES.items() if not os.path.isfile(gt[key])]
    if not missing:
        return None
    return (
        f"missing at scoring time: {'; '.join(missing)}. The EvalKit would score the sample without it and report "
        f"no error; restore it: rerun the stage that made it (materialize_dataset for a dataset sample, eval_set for "
        f"a matrix sample's final frame) or restore the evaluation tree"
    )


def score_one(request: ScoreRequest, evalkit: tuple) -> dict:
    """Runs in a scorer process: write the video, call the EvalKit, enforce the score contract.

    What fails for one sample (the EvalKit raising, a ground-truth file missing, a score outside the contract)
    comes back as that sample's `error` with evalkit.unsupported_score, for `collect` to apply
    evalkit.fail_on_error to, as to an error the evaluator reports itself (scored 0 by the EvalKit). The
    ground-truth files are checked before the EvalKit sees them (`missing_ground_truth`): it would score
    without them."""
    from videogrpo.data.video import fit_square, playback_fps, write_mp4

    run_evaluation, evaluator_map = evalkit
    named = {"task": request.task, "sample": request.sample_dir}
    if request.task not in evaluator_map:
        return {**named, "score": request.unsupported_score, "dimensions": {}, "unsupported": request.task}
    try:
        fps = playback_fps(len(request.frames), request.fps, request.max_seconds)
        frames = fit_square(request.frames, request.video_size)
        with tempfile.TemporaryDirectory() as tmp:
            path = request.keep_video or os.path.join(tmp, "generated.mp4")
            write_mp4(path, frames, fps=fps, crf=request.crf)
            gt = request.gt or gt_info(request.sample_dir)
            if missing := missing_ground_truth(gt):
                error = {"error": missing, "ground_truth_missing": True}
                return {**named, "score": request.unsupported_score, "dimensions": {}, **error}
            result = run_evaluation.evaluate_single_video(path, request.task, gt, device="cpu")
    except OSError as err:
        if (full := disk_full_message(err)) is None:
            return _failed(named, request, err)
        # Not the sample's failure: the stage stops on it (RuleScorer.collect), and a traceback per sample would
        # bury the one line that names the file and the fix.
        return {**named, "score": request.unsupported_score, "dimensions": {}, "disk_full": full}
    except Exception as err:  # noqa: BLE001 - the sample's error, reported with its traceback in the log
        return _failed(named, request, err)
    if not isinstance(result, dict):
        error = f"evaluate_single_video returned {type(result).__name__} {result!r:.200}, not a dict"
        return {**named, "score": request.unsupported_score, "dimensions": {}, "error": error}
    dimensions = plain(result.get("dimensions") or {})
    if result.get("error"):  # the EvalKit caught the evaluator's exception itself: score 0, as it returns
        return {**named, "score": 0.0, "dimensions": dimensions, "error": str(result["error"])}
    score = contract_score(result.get("score"))
    if score is None:
        value = result.get("score")
        error = f"EvalKit returned score {value!r} ({type(value).__name__}); the contract is a finite score in [0, 1]"
        return {**named, "score": request.unsupported_score, "dimensions": dimensions, "error": error}
    return {**named, "score": score, "dimensions": dimensions, "error": None}


def _failed(named: dict, request: ScoreRequest, err: Exception) -> dict:
    """The sample's own error, its traceback in the log."""
    print(f"scorer: task {request.task}, sample {request.sample_dir}:", file=sys.stderr)
    traceback.print_exc()
    error = f"{type(err).__name__}: {err} (raised while scoring; traceback in the log)"
    return {**named, "score": request.unsupported_score, "dimensions": {}, "error": error}
