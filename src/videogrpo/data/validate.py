"""Validation of a materialized dataset: every sample complete and readable, every video decodes.

Videos are decoded in a process pool (one per thread the rule was given), since a full dataset holds
tens of thousands of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from videogrpo.data.materialize import FIELDS
from videogrpo.errors import DataError
from videogrpo.progress import Progress


def check_sample(sample_dir: str, gt_frames: int | None, gt_height: int | None, gt_width: int | None) -> dict:
    """Problems of one sample (empty list when it is sound) and the shape of its ground-truth video."""
    from PIL import Image

    from videogrpo.data.video import read_video

    root = Path(sample_dir)
    problems = []
    for name in FIELDS:
        path = root / name
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{path}: missing or empty")
    if problems:
        return {"dir": sample_dir, "problems": problems}
    try:
        json.loads((root / "metadata.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        problems.append(f"{root / 'metadata.json'}: not valid JSON ({err})")
    try:
        if not (root / "video/prompt.txt").read_text(encoding="utf-8").strip():
            problems.append(f"{root / 'video/prompt.txt'}: empty prompt")
    except UnicodeDecodeError:
        problems.append(f"{root / 'video/prompt.txt'}: not UTF-8")
    for name in ("first_frame.png", "video/final_frame.png"):
        try:
            with Image.open(root / name) as image:
                image.load()
        except Exception as err:  # PIL raises many types for corrupt images
            problems.append(f"{root / name}: cannot decode image ({err})")
    shape = None
    try:
        video = read_video(root / "video/ground_truth.mp4")
        shape = list(video.shape[:3])
        frames, height, width = shape
        for label, want, got in (
            ("frames", gt_frames, frames),
            ("height", gt_height, height),
            ("width", gt_width, width),
        ):
            if want is not None and want != got:
                problems.append(f"{root / 'video/ground_truth.mp4'}: {got} {label}, expected {want} (data.gt_{label})")
    except DataError as err:
        problems.append(str(err))
    return {"dir": sample_dir, "problems": problems, "shape": shape}


def validate(
    materialized: Path,
    tasks: list[str],
    samples_per_task: int,
    gt_frames: int | None,
    gt_height: int | None,
    gt_width: int | None,
    workers: int = 1,
    log: Callable[[str], None] = print,
) -> dict:
    """Check the materialized dataset against the config; raise DataError listing what is wrong."""
    dataset = json.loads((materialized / "dataset.json").read_text())
    raw = materialized / dataset["root"]
    found_tasks = dataset["tasks"]
    problems = []
    if sorted(found_tasks) != sorted(tasks):
        problems.append(
            f"{materialized / 'dataset.json'}: tasks {sorted(found_tasks)} differ from data.task_list {sorted(tasks)}"
        )
    for task, ids in found_tasks.items():
        if len(ids) != samples_per_task:
            problems.append(f"{task}: {len(ids)} samples, expected data.samples_per_task = {samples_per_task}")
    dirs = [str(raw / task / sample_id) for task, ids in sorted(found_tasks.items()) for sample_id in ids]
    progress = Progress("validate samples", total=len(dirs), unit="samples")
    shapes: dict[str, int] = {}
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(check_sample, d, gt_frames, gt_height, gt_width) for d in dirs]
        for future in futures:
            result = future.result()
            problems += result["problems"]
            if result.get("shape"):
                key = "x".join(map(str, result["shape"]))
                shapes[key] = shapes.get(key, 0) + 1
            progress.update()
    progress.finish()
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise DataError(f"dataset {materialized} failed validation ({len(problems)} problems):\n  {shown}{more}")
    report = {
        "tasks": len(found_tasks),
        "samples": len(dirs),
        "video_shapes_frames_h_w": shapes,
        "expected": {
            "samples_per_task": samples_per_task,
            "gt_frames": gt_frames,
            "gt_height": gt_height,
            "gt_width": gt_width,
        },
    }
    log(f"validated {len(dirs)} samples of {len(found_tasks)} tasks: all complete, all videos decode")
    return report
