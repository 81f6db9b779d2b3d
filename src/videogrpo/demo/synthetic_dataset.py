"""Synthetic VBVR-Pro-RL data: small tasks with a rule the final frame can be checked against.

Writes exactly the archive format of the real dataset (docs/reference-system.md#data): tar.gz archives whose
members are `<task>/<task_dir>/<sample_id>/{first_frame.png, metadata.json, video/final_frame.png,
video/ground_truth.mp4, video/prompt.txt}` plus an ignored extra member, so the materializer and
validator run on the same code path as for the real data. Archives are byte-reproducible for a seed.

Three rules, and as many tasks as asked for: `task_names(50)` gives the real dataset's task count (the three
rules' tasks, then numbered variants of them), so the data stages can be run at the real counts
(bench/bench_data.py).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo import atomic
from videogrpo.data.video import write_mp4

FPS = 16
"""Frame rate of the ground-truth videos (that of VBVR-Pro-RL)."""
BACKGROUND = (255, 255, 255)
GRID_LINE = (200, 200, 200)
RED = (220, 30, 30)
GREEN = (0, 170, 0)
BLUE = (30, 60, 220)
BLACK = (0, 0, 0)
BAR = (40, 150, 40)


@dataclass
class Sample:
    frames: np.ndarray
    """Ground-truth video, uint8 [F, H, W, 3]; frame 0 is the first frame, the last the final frame."""
    prompt: str
    metadata: dict


def _canvas(height: int, width: int) -> np.ndarray:
    return np.full((height, width, 3), BACKGROUND, dtype=np.uint8)


def _cells(height: int, width: int, grid: int) -> tuple[int, int]:
    return height // grid, width // grid


def move_red_square(rng: np.random.Generator, frames: int, height: int, width: int) -> Sample:
    grid = 4
    ch, cw = _cells(height, width, grid)
    start, target = rng.choice(grid * grid, size=2, replace=False)
    start_rc, target_rc = divmod(int(start), grid), divmod(int(target), grid)
    base = _canvas(height, width)
    for k in range(1, grid):
        base[k * ch, :] = GRID_LINE
        base[:, k * cw] = GRID_LINE
    ty, tx = target_rc[0] * ch, target_rc[1] * cw
    base[ty : ty + ch, tx : tx + 2] = GREEN
    base[ty : ty + ch, tx + cw - 2 : tx + cw] = GREEN
    base[ty : ty + 2, tx : tx + cw] = GREEN
    base[ty + ch - 2 : ty + ch, tx : tx + cw] = GREEN
    margin_y, margin_x = max(1, ch // 4), max(1, cw // 4)
    video = np.repeat(base[None], frames, axis=0)
    for i in range(frames):
        a = i / (frames - 1)
        y = round((1 - a) * start_rc[0] * ch + a * ty) + margin_y
        x = round((1 - a) * start_rc[1] * cw + a * tx) + margin_x
        video[i, y : y + ch - 2 * margin_y, x : x + cw - 2 * margin_x] = RED
    metadata = {
        "grid": [grid, grid],
        "start_cell": list(start_rc),
        "target_cell": list(target_rc),
        "square_color": list(RED),
        "cell_size": [ch, cw],
    }
    return Sample(video, "Move the red square into the cell outlined in green.", metadata)


def fill_circle_blue(rng: np.random.Generator, frames: int, height: int, width: int) -> Sample:
    side = min(height, width)
    radius = int(rng.integers(side // 6, side // 4 + 1))
    cy = int(rng.integers(radius + 2, height - radius - 2))
    cx = int(rng.integers(radius + 2, width - radius - 2))
    yy, xx = np.mgrid[:height, :width]
    dist = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
    inside = dist <= radius - 1
    outline = (dist > radius - 1) & (dist <= radius + 0.5)
    video = np.repeat(_canvas(height, width)[None], frames, axis=0)
    for i in range(frames):
        level = cy + radius - (2 * radius) * i / (frames - 1)
        video[i][inside & (yy >= level)] = BLUE
        video[i][outline] = BLACK
    metadata = {"center": [cy, cx], "radius": radius, "fill_color": list(BLUE)}
    return Sample(video, "Fill the outlined circle with blue, from the bottom up.", metadata)


def grow_bar_to_line(rng: np.random.Generator, frames: int, height: int, width: int) -> Sample:
    bar_w = max(4, width // 6)
    x0 = int(rng.integers(2, width - bar_w - 2))
    start_top = height - max(2, height // 8)
    target_top = int(rng.integers(height // 6, height // 2))
    video = np.repeat(_canvas(height, width)[None], frames, axis=0)
    dash = np.arange(width) % 6 < 4
    for i in range(frames):
        top = round(start_top + (target_top - start_top) * i / (frames - 1))
        video[i, top:, x0 : x0 + bar_w] = BAR
        video[i, target_top - 1, dash] = RED
    metadata = {"bar_x": [x0, x0 + bar_w], "target_top": target_top, "bar_color": list(BAR)}
    return Sample(video, "Grow the green bar up to the dashed red line.", metadata)


TASKS: dict[str, Callable[[np.random.Generator, int, int, int], Sample]] = {
    "S-1_move_red_square_data-generator": move_red_square,
    "S-2_fill_circle_blue_data-generator": fill_circle_blue,
    "S-3_grow_bar_to_line_data-generator": grow_bar_to_line,
}


_VARIANT = re.compile(r"^S-\d+_(?P<rule>[a-z_]+)_v\d+_data-generator$")


def task_names(count: int) -> list[str]:
    """`count` synthetic task names: the three rules' tasks, then numbered variants of them in turn
    (`S-4_move_red_square_v2_data-generator`, ...), whose samples differ (a sample's seed includes its task)."""
    rules = list(TASKS)
    names = rules[:count]
    for number in range(len(rules) + 1, count + 1):
        rule = rules[(number - 1) % len(rules)]
        names.append(f"S-{number}_{_short(rule)}_v{(number - 1) // len(rules) + 1}_data-generator")
    return names


def rule_of(task: str) -> Callable[[np.random.Generator, int, int, int], Sample] | None:
    """The generator of one of the rules' tasks or of a variant of it (task_names); None for any other name."""
    if task in TASKS:
        return TASKS[task]
    match = _VARIANT.match(task)
    by_short = {_short(name): rule for name, rule in TASKS.items()}
    return by_short.get(match["rule"]) if match else None


def _short(task: str) -> str:
    return task.split("_", 1)[1].removesuffix("_data-generator")


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _mp4(frames: np.ndarray, fps: int) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.mp4"
        write_mp4(path, frames, fps=fps, crf=10)
        return path.read_bytes()


def sample_members(
    task: str, index: int, seed: int, frames: int, height: int, width: int, fps: int
) -> dict[str, bytes]:
    """The archive members of one sample, keyed by their path inside the archive."""
    # One generator per (seed, task, index): a sample does not depend on which others were made.
    task_key = int.from_bytes(hashlib.sha256(task.encode()).digest()[:8], "big")
    rng = np.random.default_rng([seed, task_key, index])
    rule = rule_of(task)
    if rule is None:
        raise ValueError(f"no synthetic generator for task {task!r}; known: {sorted(TASKS)} and their task_names()")
    sample = rule(rng, frames, height, width)
    sample_id = f"{_short(task)}_{index:05d}"
    prefix = f"{task}/{_short(task)}_task/{sample_id}"
    metadata = dict(sample.metadata, task=task, sample_id=sample_id, frames=frames, height=height, width=width)
    return {
        f"{prefix}/first_frame.png": _png(sample.frames[0]),
        f"{prefix}/metadata.json": json.dumps(metadata, indent=2, sort_keys=True).encode(),
        f"{prefix}/video/final_frame.png": _png(sample.frames[-1]),
        f"{prefix}/video/ground_truth.mp4": _mp4(sample.frames, fps),
        f"{prefix}/video/prompt.txt": sample.prompt.encode(),
        # The real archives carry extra files that consumers must ignore.
        f"{prefix}/video/generation_info.json": json.dumps({"generator": "videogrpo.synthetic"}).encode(),
    }


def _write_archive(path: Path, members: dict[str, bytes]) -> None:
    with atomic.atomic_path(path) as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name in sorted(members):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(members[name]), 0, 0o644
                    tar.addfile(info, io.BytesIO(members[name]))


def _archive_of(
    path: Path, tasks: list[str], samples_per_task: int, seed: int, frames: int, height: int, width: int, fps: int
) -> tuple[Path, int]:
    """Write one archive of `tasks`; (its path, its member count). One archive is in memory at a time."""
    members: dict[str, bytes] = {}
    for task in tasks:
        for index in range(samples_per_task):
            members.update(sample_members(task, index, seed, frames, height, width, fps))
    _write_archive(path, members)
    return path, len(members)


def generate(
    out_dir: str | Path,
    tasks: list[str],
    samples_per_task: int,
    seed: int,
    frames: int,
    height: int,
    width: int,
    fps: int,
    archive_dir: str = "VBVR-Pro-RL-Video",
    tasks_per_archive: int = 2,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
) -> list[Path]:
    """Write the synthetic dataset as tar.gz archives under out_dir/archive_dir; return their paths.

    `workers` processes write archives at once (the bytes do not depend on it)."""
    unknown = [t for t in tasks if rule_of(t) is None]
    if unknown:
        raise ValueError(f"no synthetic generator for tasks {unknown}; known: {sorted(TASKS)} and their task_names()")
    out = Path(out_dir) / archive_dir
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (out / f"VBVR-Pro-RL-Video_part{part:03d}.tar.gz", tasks[first : first + tasks_per_archive])
        for part, first in enumerate(range(0, len(tasks), tasks_per_archive))
    ]
    media = (samples_per_task, seed, frames, height, width, fps)
    if workers <= 1 or len(jobs) == 1:
        written = (_archive_of(path, part, *media) for path, part in jobs)
        return [_report(path, count, progress) for path, count in written]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(_archive_of, path, part, *media) for path, part in jobs]
        return [_report(*future.result(), progress) for future in futures]


def _report(path: Path, members: int, progress: Callable[[str], None] | None) -> Path:
    if progress:
        progress(f"wrote {path.name}: {members} members")
    return path
