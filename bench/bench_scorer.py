"""Benchmark: rule-reward scoring throughput against the number of scorer workers, and the cost of
preparing one scorer video.

    .venv/bin/python bench/bench_scorer.py [--videos 24] [--workers 1 2 4] [--repeats 3] [--smoke]

In one invocation: the reference EvalKit scores `--videos` rollouts of the synthetic dataset through
`RuleScorer` (scorer processes of evalkit.python in the checkout, every video prepared and written by the
worker) with each
worker count; videos per second are printed with the spread between identical runs. Then the
preparation the reward does for every rollout at the recipes' size (81 frames scaled with Lanczos and
padded to 1024x1024, x264 CRF 12, every frame kept) is timed on its own, in this process. The EvalKit's
evaluators here are the synthetic ones (cheap): the numbers say what the pipeline around them costs.
Record the output in bench/RESULTS.md. `--smoke`: 2 small videos (17 frames, 64x64) by one worker, one
17-frame 64x64 rollout prepared at 128x128, once (what the tests run, seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=24, help="rollouts scored per measurement")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="scorer worker counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every measurement")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 2 small videos, one worker, once")
    args = parser.parse_args()
    # Rollouts scored (frames, side, scored at), and the one prepared on its own (frames, side, prepared at).
    frames, side, scored, prepare = 81, 128, 256, (81, 512, 1024)
    if args.smoke:
        args.videos, args.workers, args.repeats = 2, [1], 1
        frames, side, scored, prepare = 17, 64, 64, (17, 64, 128)
    from videogrpo.data.dataset import load_split
    from videogrpo.data.materialize import materialize
    from videogrpo.data.video import fit_square, playback_fps, read_video, write_mp4
    from videogrpo.demo import synthetic_dataset
    from videogrpo.rewards.rule import RuleScorer, ScoreRequest

    evalkit = REPO / "src/videogrpo/demo/stand_in_evalkit"
    with tempfile.TemporaryDirectory(prefix="videogrpo-scorer-") as tmp:
        root = Path(tmp)
        tasks = list(synthetic_dataset.TASKS)
        synthetic_dataset.generate(root / "archives", tasks, 4, seed=0, frames=frames, height=side, width=side, fps=16)
        archives = sorted((root / "archives/VBVR-Pro-RL-Video").glob("*.tar.gz"))
        materialize(archives, root / "data", tasks, 4, 0, 42, "bench", {}, log=lambda _: None)
        samples = load_split(root / "data", "rl")
        videos = [read_video(s.directory / "video/ground_truth.mp4") for s in samples]
        picks = [(videos[i % len(videos)], samples[i % len(samples)]) for i in range(args.videos)]
        requests = [ScoreRequest(v, s.task, str(s.directory), 16, scored, 5.0625, 12, 0.0) for v, s in picks]
        rates: dict[int, list[float]] = {w: [] for w in args.workers}
        for _ in range(args.repeats):
            for workers in args.workers:
                with RuleScorer(evalkit, workers=workers, threads_per_worker=1) as scorer:
                    scorer.collect([scorer.submit(r) for r in requests[:workers]])  # warm: workers started
                    start = time.perf_counter()
                    scorer.collect([scorer.submit(r) for r in requests])
                    rates[workers].append(args.videos / (time.perf_counter() - start))
        rollout = smooth_rollout(prepare[0], prepare[1])
        resize, encode = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fitted = fit_square(rollout, prepare[2])
            middle = time.perf_counter()
            write_mp4(os.path.join(tmp, "prepared.mp4"), fitted, fps=playback_fps(prepare[0], 16, 5.0625), crf=12)
            resize.append(middle - start)
            encode.append(time.perf_counter() - middle)
    cpus = len(os.sched_getaffinity(0))
    print(
        f"{args.videos} rollouts ({frames} frames, {side}x{side}, scored at {scored}x{scored}) per run, "
        f"{args.repeats} runs; {cpus} CPUs"
    )
    print("\n| scorer workers | videos/s (median) | spread of identical runs | / one worker |")
    print("|---|---|---|---|")
    one = statistics.median(rates[args.workers[0]])
    for workers, values in rates.items():
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median
        print(f"| {workers} | {median:.2f} | {100 * spread:.0f}% | {median / one:.2f} |")
    total = [r + e for r, e in zip(resize, encode)]
    print(
        f"\nPreparing one scorer video (a smooth {prepare[0]}-frame {prepare[1]}x{prepare[1]} rollout -> "
        f"{prepare[2]}x{prepare[2]}): "
        f"{statistics.median(total):.2f} s median ({min(total):.2f}-{max(total):.2f}): Lanczos scale and pad "
        f"{statistics.median(resize):.2f} s, x264 CRF 12 encode {statistics.median(encode):.2f} s"
    )


def smooth_rollout(frames: int, side: int) -> np.ndarray:
    """A rollout-like video: a colour gradient with a disc moving across it (x264 sees real motion)."""
    yy, xx = np.mgrid[:side, :side]
    base = np.stack([xx * 255 // side, yy * 255 // side, np.full_like(xx, 96)], axis=-1).astype(np.uint8)
    video = np.repeat(base[None], frames, axis=0)
    for t in range(frames):
        cy, cx = side // 2, side // 8 + t * (3 * side // 4) // frames
        video[t][(yy - cy) ** 2 + (xx - cx) ** 2 < (side // 10) ** 2] = (230, 40, 40)
    return video


if __name__ == "__main__":
    sys.exit(main())
