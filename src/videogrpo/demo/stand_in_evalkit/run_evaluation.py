"""Entry point of the reference EvalKit: `evaluate_single_video` scores one generated video.

Usable as a library (the pipeline imports it in its scorer processes) or from the command line:
    python run_evaluation.py VIDEO TASK SAMPLE_DIR
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# Imported at module level for what they require of the environment, as the public EvalKit's run_evaluation.py
# imports them: a scorer environment without either fails here as it fails with the real EvalKit.
import numpy as np  # noqa: F401
from tqdm import tqdm  # noqa: F401

from vbvr_bench.evaluators import TASK_EVALUATOR_MAP
from vbvr_bench.utils import read_image, unpad_resize
from vbvr_bench.video_io import read_frames

# As the real compatibility revisions do, data files are read relative to the working directory: scorer
# processes must run in the checkout.
with open("annotations/tasks.json", encoding="utf-8") as _f:
    TASK_DESCRIPTIONS = json.load(_f)


def evaluate_single_video(video_path, task_name, gt_info=None, device="cuda"):
    """Score a generated video against its ground truth: {"score", "dimensions"} (+ "error" on failure)."""
    try:
        evaluator = TASK_EVALUATOR_MAP[task_name]
        gt_info = gt_info or {}
        gt_final = read_image(gt_info["gt_final_frame"])
        with open(gt_info["metafile_path"][0]) as f:
            meta = json.load(f)
        frames = read_frames(video_path)
        final = unpad_resize(frames[-1], gt_final.shape[0], gt_final.shape[1])
        dimensions = evaluator(final, gt_final, meta)
        score = sum(dimensions.values()) / len(dimensions)
        if not math.isfinite(score):
            raise ValueError(f"non-finite score {score}")
        return {"score": float(min(max(score, 0.0), 1.0)), "dimensions": dimensions}
    except Exception as err:  # the contract: an evaluator failure scores 0 and says why
        return {"score": 0.0, "dimensions": {}, "error": f"{type(err).__name__}: {err}"}


def gt_info_for(sample_dir):
    root = Path(sample_dir)
    return {
        "gt_video_path": str(root / "video/ground_truth.mp4"),
        "gt_first_frame": str(root / "first_frame.png"),
        "gt_final_frame": str(root / "video/final_frame.png"),
        "prompt": (root / "video/prompt.txt").read_text(),
        "gt_path": str(root),
        "metafile_path": [str(root / "metadata.json")],
    }


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python run_evaluation.py VIDEO TASK SAMPLE_DIR")
    video, task, sample = sys.argv[1:]
    print(json.dumps(evaluate_single_video(video, task, gt_info_for(sample), device="cpu"), indent=2))
