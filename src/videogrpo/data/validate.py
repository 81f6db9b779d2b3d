"""Validation of a materialized dataset: every sample complete and readable, every video decodes.

Videos are decoded in a process pool (one per thread the rule was given), since a full dataset holds
tens of thousands of them: samples go to the workers in chunks (one round trip per chunk, not per sample),
and only a few chunks are in flight at a time, so the parent holds the results of those, never of all.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

from videogrpo.data.materialize import FIELDS
from videogrpo.errors import DataError
from videogrpo.progress import Progress


def check_sample(sample_dir: str, gt_frames: int | None, gt_height: int | None, gt_width: int | None) -> dict:
    """Problems of one sample (empty list when it is sound) and the shape of its ground-truth video."""
    from PIL import Image

    from videogrpo.data.video import decoded_shape

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
        frames, height, width = decoded_shape(root / "video/ground_truth.mp4")
        shape = [frames, height, width]
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


_CHUNK = 16  # samples a worker checks per round trip: a few tens of milliseconds of decoding
_AHEAD = 4  # chunks in flight per worker: none waits for the parent, which holds only these


def check_samples(sample_dirs: list[str], gt_frames: int | None, gt_height: int | None, gt_width: int | None):
    """check_sample of each directory, in order."""
    return [check_sample(d, gt_frames, gt_height, gt_width) for d in sample_dirs]


def in_order(pool: Executor, fn: Callable, items: Iterable, ahead: int, *args) -> Iterator:
    """fn(item, *args) of every item, in order, at most `ahead` submitted and not yet consumed at a time
    (Executor.map submits every item at once and keeps each result until the end)."""
    items = iter(items)
    pending = deque(pool.submit(fn, item, *args) for item in itertools.islice(items, ahead))
    while pending:
        result = pending.popleft().result()
        for item in itertools.islice(items, 1):
            pending.append(pool.submit(fn, item, *args))
        yield result


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
    workers = max(1, workers)
    chunks = (dirs[i : i + _CHUNK] for i in range(0, len(dirs), _CHUNK))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for results in in_order(pool, check_samples, chunks, _AHEAD * workers, gt_frames, gt_height, gt_width):
            for result in results:
                problems += result["problems"]
                if result.get("shape"):
                    key = "x".join(map(str, result["shape"]))
                    shapes[key] = shapes.get(key, 0) + 1
            progress.update(len(results))
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
