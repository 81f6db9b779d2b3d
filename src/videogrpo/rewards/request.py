"""One rollout to score, as every reward receives it, and what the rewards share in reporting.

The driver makes a `ScoreRequest` (the rule reward sends it to a scorer process as plain values and one
frame blob; the judge reads it in a thread); `warn_once` keeps a failing task to one warning per run.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np


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


def request_to_message(request: ScoreRequest) -> tuple[dict, np.ndarray]:
    """A request as plain values and its frames as one contiguous blob: nothing of the driver's numpy is pickled."""
    frames = np.ascontiguousarray(request.frames)
    fields_ = {f.name: getattr(request, f.name) for f in fields(request) if f.name != "frames"}
    return dict(fields_, frames_shape=frames.shape, frames_dtype=frames.dtype.str), frames


def request_from_message(message: dict, frames: bytearray) -> ScoreRequest:
    message = dict(message)
    shape, dtype = message.pop("frames_shape"), message.pop("frames_dtype")
    return ScoreRequest(np.frombuffer(frames, dtype=dtype).reshape(shape), **message)


def warn_once(warned: set[str], key: str, message: str) -> None:
    """One warning per key (a task) for the whole run, not one per video."""
    if key not in warned:
        warned.add(key)
        print(f"warning: {message}", file=sys.stderr, flush=True)
