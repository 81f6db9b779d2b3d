"""What the check at the start of a run costs (pipeline/start_check.py): a forced training whose model pipeline holds
a 10 GB transformer (a sparse file of the TI2V-5B's bf16 size) and a dataset of many small files, with a cold digest
cache (every byte hashed) and a warm one (a stat per file), side by side in one run.

    python bench/bench_start_check.py [--gb 10] [--samples 2000] [--repeats 3] [--smoke]

The model is what fetch_model records (its manifest made here first, which hashes it once); the dataset raw/ tree
is what materialize_dataset records. Prints one table; results go to bench/RESULTS.md. `--smoke`: a 10 MB model, 20
samples, one repeat (what the tests run, seconds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from videogrpo.pipeline.start_check import StageJob, check_jobs
from videogrpo.provenance.manifest import StageRun


def make_model(root: Path, gb: float) -> Path:
    model = root / "pipeline"
    (model / "transformer").mkdir(parents=True)
    weights = model / "transformer/diffusion_pytorch_model.safetensors"
    with open(weights, "wb") as f:
        f.truncate(int(gb * 1e9))  # sparse: the bytes are hashed as a real file's would be, none is written
    (model / "transformer/config.json").write_text("{}")
    (model / "model_index.json").write_text("{}")
    return model


def make_raw(root: Path, samples: int) -> Path:
    raw = root / "materialized/raw"
    for i in range(samples):
        sample = raw / f"task-{i % 50:02d}" / f"sample-{i:06d}"
        (sample / "video").mkdir(parents=True)
        for name, size in (("first_frame.png", 2048), ("video/final_frame.png", 2048), ("video/prompt.txt", 64)):
            (sample / name).write_bytes(os.urandom(size))
        (sample / "video/ground_truth.mp4").write_bytes(os.urandom(16384))
        (sample / "metadata.json").write_text("{}")
    return raw


def manifest(root: Path, stage: str, **outputs: Path) -> Path:
    path = root / f"{stage}.manifest.json"
    with StageRun(stage, path, inputs={}) as run:
        for name, out in outputs.items():
            run.output(name, out)
    return path


def timed(job: StageJob, cache: Path) -> float:
    start = time.perf_counter()
    checked, problems = check_jobs([job], cache)
    assert checked == 1 and not problems, problems
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=10.0, help="size of the sparse transformer weights")
    parser.add_argument("--samples", type=int, default=2000, help="samples of the dataset's raw/ (5 files each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 10 MB, 20 samples, one repeat")
    args = parser.parse_args()
    if args.smoke:
        args.gb, args.samples, args.repeats = 0.01, 20, 1
    root = Path(tempfile.mkdtemp(prefix="bench-start-check-", dir=args.dir))
    try:
        run(args, root)
    finally:
        shutil.rmtree(root)


def run(args: argparse.Namespace, root: Path) -> None:
    model, raw = make_model(root, args.gb), make_raw(root, args.samples)
    fetch, materialize = manifest(root, "fetch_model", model=model), manifest(root, "materialize_dataset", raw=raw)
    out = root / "train.manifest.json"
    out.write_text("{}")  # a training that holds outputs from before: the job the check covers
    cases = {
        f"model ({args.gb:g} GB)": StageJob("train", {"model": str(model)}, [str(fetch)], [str(out)]),
        f"raw/ ({args.samples * 5} files)": StageJob("train", {"raw": str(raw)}, [str(materialize)], [str(out)]),
    }
    rows = []
    for name, job in cases.items():
        cold, warm = [], []
        for repeat in range(args.repeats):
            cache = root / f"cache-{name[:5]}-{repeat}.json"
            cold.append(timed(job, cache))
            warm.append(timed(job, cache))
        rows.append((name, statistics.median(cold), statistics.median(warm)))
    print(f"start check of a forced training's inputs, median of {args.repeats} (seconds)\n")
    print("| input | cold cache | warm cache | cold / warm |\n|---|---|---|---|")
    for name, cold, warm in rows:
        print(f"| {name} | {cold:.2f} | {warm:.3f} | {cold / warm:.0f} |")


if __name__ == "__main__":
    main()
