"""Benchmark: how the data stages' cost grows with the number of samples, through the workflow.

    python bench/bench_data.py [--samples 1000 10000 50000] [--tasks 50] [--smoke]

For every sample count, in one invocation: the synthetic generator (videogrpo.demo.synthetic_dataset)
writes `--tasks` tasks (the real dataset's 50 by default) with the samples spread evenly over them, one
tar.gz archive per task, tiny media (5 frames of 32 x 32) in the real member layout; a loopback Hugging
Face Hub (tests/hub_server.py, LFS redirects and all) serves them at a pinned commit; and real
`snakemake` runs the real rules one target at a time on a copy of the checkout, as a run on the real
dataset (`data.source: hub`) would:

1. `snakemake fetch_dataset`: the download, verified against the listing;
2. `snakemake materialize_dataset`: the streaming unpack, its checks, digests and manifest;
3. `snakemake validate_dataset`: every sample opened, every video decoded, the tree digested again;
4. dataset loading, in a process of its own on the materialized output: what the trainer does before its
   first update (load_split, training_order, the data-loader topology with its order digest, the update
   plan, and the batch of every update of an epoch).

Measured: the wall time of each snakemake run (its planning included), and of the stage command alone;
the CPU time (user + system) of both, which other work on a shared machine does not inflate as it does
wall time; the peak RSS of the largest process (the stage or one of its workers: getrusage of a wrapper
that the job's PATH finds first as `videogrpo`); for loading, its wall and CPU time and the peak of the
Python heap it allocates (tracemalloc, in a second pass: the trainer's imports are not the load's).
Growth is read as "x per 10x": the ratio between two counts scaled to a tenfold step (10 is linear, 1
flat). Each count runs once. bench/bench_materialize.py measures the unpack against tar at the real
bytes per sample; this one, how the stages grow with the number of samples and files.
`--smoke` runs one tiny count (seconds). Record the output in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
COMMIT = "5a3b1e0c9d8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b"
FRAMES, SIDE = 5, 32  # tiny media: about 3 KB a sample
STAGES = ("fetch_dataset", "materialize_dataset", "validate_dataset")
RUSAGE_ENV = "VIDEOGRPO_BENCH_RUSAGE"

# Put first on the jobs' PATH as `videogrpo`: runs the real command, then appends its wall time, the CPU time
# of its process tree and the peak RSS of its largest process (ru_maxrss of the waited-for tree, KiB on
# Linux) to $VIDEOGRPO_BENCH_RUSAGE.
WRAPPER = """#!{python}
import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen([{real!r}, *sys.argv[1:]])
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
with open(os.environ["{env}"], "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:3], "seconds": time.perf_counter() - start,
                          "cpu_seconds": usage.ru_utime + usage.ru_stime, "max_rss_kib": usage.ru_maxrss}}) + "\\n")
sys.exit(child.returncode)
"""


def copy_checkout(dest: Path) -> None:
    """The checkout's files (tracked and untracked, not ignored): what the workflow reads."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
    )
    for rel in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / rel
        if source.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(source), dest / rel)
        elif source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)


def run_measured(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the process tree, peak RSS KiB of its largest process) of one command;
    exits on failure."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        if child.returncode:
            log.seek(0)
            raise SystemExit(f"{' '.join(argv)} exited {child.returncode} in {cwd}:\n{log.read()[-6000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def measure_load(dataset: Path, configfiles: list[str]) -> None:
    """(In the loading subprocess.) Print JSON: the load's wall time and its peak Python heap."""
    import tracemalloc

    from videogrpo.config import load
    from videogrpo.data.dataset import batch_for_step, load_split, steps_per_epoch, training_order
    from videogrpo.grpo.assignment import dataloader_topology
    from videogrpo.grpo.trainer import run_plan

    cfg = load(configfiles)

    def trainer_load() -> int:
        order = training_order(load_split(dataset, "rl"), cfg.data.shuffle_seed)
        dataloader_topology(cfg, 2, order)
        run_plan(cfg, len(order))
        for step in range(steps_per_epoch(len(order), cfg.grpo.prompts_per_step)):
            batch_for_step(order, cfg.grpo.prompts_per_step, step)
        return len(order)

    start, cpu = time.perf_counter(), time.process_time()
    samples = trainer_load()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    tracemalloc.start()
    trainer_load()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"samples": samples, "seconds": seconds, "cpu_seconds": cpu, "heap_peak_bytes": peak}))


def bench_count(root: Path, checkout: Path, env: dict[str, str], tasks: list[str], samples: int) -> dict:
    """Generate, serve and run the data stages at one sample count; the measurements by row name."""
    from videogrpo.demo import synthetic_dataset

    from hub_server import HubServer  # tests/ is on sys.path (main)

    per_task = samples // len(tasks)
    start = time.perf_counter()
    archives = synthetic_dataset.generate(
        root / f"archives-{samples}",
        tasks,
        per_task,
        seed=0,
        frames=FRAMES,
        height=SIDE,
        width=SIDE,
        fps=synthetic_dataset.FPS,
        tasks_per_archive=1,
        workers=len(os.sched_getaffinity(0)),
    )
    generated = time.perf_counter() - start
    files = {f"VBVR-Pro-RL-Video/{path.name}": path.read_bytes() for path in archives}
    shutil.rmtree(root / f"archives-{samples}")
    repo_id = f"bench/vbvr-{samples}"
    config = checkout / f"bench-data-{samples}.yaml"
    data = {
        "source": "hub",
        "repo_id": repo_id,
        "revision": COMMIT,
        "split_name": "In-Domain_50",
        "task_list": "bench-tasks.txt",
        "samples_per_task": per_task,
        "heldout_per_task": 0,  # as the released recipes
        "gt_frames": FRAMES,
        "gt_height": SIDE,
        "gt_width": SIDE,
    }
    # No held-out samples, so the matrix evaluates on the first training prompts, as the recipes do.
    config.write_text(yaml.safe_dump({"data": data, "matrix": {"split": "rl"}}))
    rusage = root / f"rusage-{samples}.jsonl"
    job_env = dict(env, **{RUSAGE_ENV: str(rusage)})
    # (what, unit) -> value; units "s" (wall), "cpu" (CPU seconds) and "MiB" (peak memory)
    row: dict[tuple[str, str], float] = {("generate the archives (not a stage)", "s"): generated}
    with HubServer({("dataset", repo_id): {COMMIT: files}}) as hub:
        job_env["HF_ENDPOINT"] = hub.endpoint
        for rule in STAGES:
            seconds, cpu, rss = run_measured(
                ["snakemake", rule, "--cores", "2", "--configfile", config.name], checkout, job_env
            )
            (stage,) = [json.loads(line) for line in rusage.read_text().splitlines()]
            rusage.unlink()
            row[(f"{rule}: snakemake run", "s")] = seconds
            row[(f"{rule}: stage", "s")] = stage["seconds"]
            row[(f"{rule}: snakemake run, without the stage", "cpu")] = cpu - stage["cpu_seconds"]
            row[(f"{rule}: stage", "cpu")] = stage["cpu_seconds"]
            row[(f"{rule}: snakemake run", "MiB")] = rss / 1024
            row[(f"{rule}: stage", "MiB")] = stage["max_rss_kib"] / 1024
    (validation,) = checkout.glob("results/data/*/validation.json")
    checked = json.loads(validation.read_text())["samples"]
    if checked != samples:
        raise SystemExit(f"{validation}: {checked} samples validated, expected {samples}")
    dataset = validation.parent / "materialized"
    load_cmd = [sys.executable, __file__, "--load", str(dataset), "config/config.yaml", config.name]
    done = subprocess.run(load_cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"loading failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    loaded = json.loads(done.stdout.splitlines()[-1])
    if loaded["samples"] != samples:
        raise SystemExit(f"the trainer's order holds {loaded['samples']} samples, expected {samples}")
    row[("dataset loading (trainer)", "s")] = loaded["seconds"]
    row[("dataset loading (trainer)", "cpu")] = loaded["cpu_seconds"]
    row[("dataset loading (trainer): Python heap", "MiB")] = loaded["heap_peak_bytes"] / 2**20
    row[("archives", "disk")] = sum(len(b) for b in files.values()) / 2**20
    row[("raw/", "disk")] = _du(dataset / "raw") / 2**20
    shutil.rmtree(checkout / "results")  # the next count starts from nothing, with the disk space back
    return row


def _du(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (allocated blocks)."""
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*"))


def growth(values: list[float], counts: list[int]) -> list[str]:
    """The ratio between consecutive counts, scaled to a tenfold step (10: linear; 1: flat)."""
    out = []
    for (a, n), (b, m) in zip(zip(values, counts), zip(values[1:], counts[1:])):
        if a <= 0 or b <= 0:
            out.append("-")
            continue
        per_10x = 10 ** (math.log(b / a) / math.log(m / n))
        out.append(f"x{b / a:.2f} (x{per_10x:.1f} per 10x)")
    return out


def table(rows: list[dict], counts: list[int], unit: str) -> None:
    steps = [f"{n:,} -> {m:,}" for n, m in zip(counts, counts[1:])]
    print("\n| " + " | ".join(["what", *(f"{n:,} samples" for n in counts), *steps]) + " |")
    print("|" + "---|" * (1 + len(counts) + len(steps)))
    for what, kind in rows[0]:
        if kind == unit:
            values = [row[(what, kind)] for row in rows]
            shown = [f"{v:.1f}" if unit == "MiB" else f"{v:.2f}" for v in values]
            print(f"| {what} | " + " | ".join(shown + growth(values, counts)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1000, 10000, 50000], help="sample counts")
    parser.add_argument("--tasks", type=int, default=50, help="tasks (one archive each); the real dataset has 50")
    parser.add_argument("--smoke", action="store_true", help="10 samples of 5 tasks: seconds, for `make test`")
    parser.add_argument("--load", nargs="+", help=argparse.SUPPRESS)  # the loading subprocess
    args = parser.parse_args()
    if args.load:
        measure_load(Path(args.load[0]), args.load[1:])
        return
    if args.smoke:
        args.samples, args.tasks = [10], 5
    counts = sorted(args.samples)
    if any(n % args.tasks for n in counts):
        raise SystemExit(f"--samples {counts}: every count must be a multiple of --tasks {args.tasks}")
    from videogrpo.demo import synthetic_dataset

    sys.path.insert(0, str(REPO / "tests"))  # the loopback Hub the tests serve the dataset from
    tasks = synthetic_dataset.task_names(args.tasks)
    root = Path(tempfile.mkdtemp(prefix="videogrpo-bench-data-"))
    try:
        checkout = root / "checkout"
        copy_checkout(checkout)
        (checkout / "bench-tasks.txt").write_text("\n".join(tasks) + "\n")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        real = shutil.which("videogrpo", path=str(Path(sys.executable).parent)) or shutil.which("videogrpo")
        if real is None:
            raise SystemExit("no `videogrpo` command on PATH: activate the environment (make env)")
        wrapper = bin_dir / "videogrpo"
        wrapper.write_text(WRAPPER.format(python=sys.executable, real=real, env=RUSAGE_ENV))
        wrapper.chmod(0o755)
        env = dict(
            os.environ,
            PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
            HF_HOME=str(root / "hf-home"),
            HF_HUB_DISABLE_TELEMETRY="1",
            WANDB_MODE="offline",
        )
        rows = [bench_count(root, checkout, env, tasks, n) for n in counts]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{args.tasks} tasks, one archive each, {FRAMES} frames of {SIDE} x {SIDE} a sample; "
        f"{len(os.sched_getaffinity(0))} CPUs; snakemake --cores 2; one run per count"
    )
    print(
        "disk: archives "
        + ", ".join(f"{r[('archives', 'disk')]:.0f}" for r in rows)
        + " MiB; raw/ "
        + ", ".join(f"{r[('raw/', 'disk')]:.0f}" for r in rows)
        + " MiB"
    )
    print("\nWall time, seconds (a snakemake run includes planning the DAG and starting the job)")
    table(rows, counts, "s")
    print(
        "\nCPU time, seconds (user + system, every process of the tree: what other work on the machine does not"
        " inflate)"
    )
    table(rows, counts, "cpu")
    print(
        "\nPeak memory, MiB: RSS of the largest process (a stage: the stage or one of its workers; a snakemake run:"
        " snakemake or any process under it); dataset loading: the Python heap it allocates (tracemalloc)"
    )
    table(rows, counts, "MiB")


if __name__ == "__main__":
    main()
