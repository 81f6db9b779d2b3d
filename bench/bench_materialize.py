"""Benchmark: the materialize_dataset stage against tar, and the tree digest against in-memory hashlib.

    .venv/bin/python bench/bench_materialize.py [--mb 480] [--archives 10] [--repeats 3] [--fresh-ext4] [--smoke]

In one invocation, on archives it generates in a temporary directory (incompressible media: random
bytes in the VBVR member layout, ~200 KB per sample, gzip level 1) on the same file system:
1. `videogrpo stage materialize-dataset` as the workflow runs it (a fetch manifest upstream, so every
   archive's SHA-256 is compared; unpack, checks, atomic writes, digests of everything, manifest),
   with `--workers 2` (the default on a 2-core job) and `--workers 1`;
2. `tar -xzf` of one archive at a time, of two at a time, and one at a time followed by `sha256sum` of
   every file (what it takes to unpack and digest with standard tools);
3. the tree digest of the unpacked tree against hashlib over the same bytes already in memory.
Every command runs `--repeats` times, interleaved, into a fresh directory; medians are printed with the
spread between identical runs. The page cache is warm for every command alike. With `--fresh-ext4`
(root), everything happens on a new ext4 file system in memory (a loop device over tmpfs), so the
disk's write-back does not time the commands. Record the output in bench/RESULTS.md. `--smoke`: 4 MB in 2
archives, one repeat (what the tests run, seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

FIELD_SIZES = {
    "first_frame.png": 9_000,
    "metadata.json": 300,
    "video/final_frame.png": 9_000,
    "video/ground_truth.mp4": 180_000,
    "video/prompt.txt": 400,
    "video/generation_info.json": 600,  # ignored by the unpack, as in the real archives
}


def generate(root: Path, total_mb: int, n_archives: int) -> tuple[list[Path], list[str], int]:
    rng = np.random.default_rng(0)
    per_sample = sum(FIELD_SIZES.values())
    samples = max(1, total_mb * 2**20 // per_sample // n_archives)
    tasks = [f"B-{i}_bench_task_data-generator" for i in range(n_archives)]
    out = root / "archives/VBVR-Pro-RL-Video"
    out.mkdir(parents=True)
    paths = []
    for task in tasks:
        path = out / f"{task}.tar.gz"
        with open(path, "wb") as raw, gzip.GzipFile("", "wb", compresslevel=1, fileobj=raw, mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w") as tar:
                for index in range(samples):
                    for field, size in FIELD_SIZES.items():
                        info = tarfile.TarInfo(f"{task}/{task}_dir/{index:06d}/{field}")
                        info.size = size
                        tar.addfile(info, io.BytesIO(rng.bytes(size)))
        paths.append(path)
    return paths, tasks, samples


def fetch_manifest(root: Path, archives_dir: Path) -> Path:
    from videogrpo.provenance.manifest import StageRun

    manifest = root / "fetch_dataset.manifest.json"
    with StageRun("fetch_dataset", manifest, inputs={}) as stage:
        stage.output("archives", archives_dir)
    return manifest


def timed(command: list[str] | str, out: Path, shell: bool = False) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    done = subprocess.run(command, shell=shell, capture_output=True, text=True, cwd=out)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=480, help="size of the generated archives in all, MB")
    parser.add_argument("--archives", type=int, default=10, help="number of archives")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every command (the median is printed)")
    parser.add_argument("--fresh-ext4", action="store_true", help="run on a new in-memory ext4 file system (root)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 4 MB in 2 archives, one repeat")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.archives, args.repeats = 4, 2, 1
    with contextlib.ExitStack() as stack:
        where = stack.enter_context(fresh_ext4(3 * args.mb)) if args.fresh_ext4 else None
        run(args, Path(tempfile.mkdtemp(prefix="videogrpo-materialize-", dir=where)))


@contextlib.contextmanager
def fresh_ext4(size_mb: int):
    """A new ext4 file system on a loop device over tmpfs, mounted for the block."""
    base = Path(tempfile.mkdtemp(prefix="videogrpo-ext4-"))
    ram, mount = base / "ram", base / "mnt"
    ram.mkdir()
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb + 200}m", "tmpfs", str(ram)], check=True)
    try:
        subprocess.run(["truncate", "-s", f"{size_mb}M", str(ram / "fs.img")], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(ram / "fs.img")], check=True)
        subprocess.run(["mount", "-o", "loop", str(ram / "fs.img"), str(mount)], check=True)
        try:
            yield str(mount)
        finally:
            subprocess.run(["umount", str(mount)], check=False)
    finally:
        subprocess.run(["umount", str(ram)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def run(args: argparse.Namespace, root: Path) -> None:
    videogrpo = str(Path(sys.executable).parent / "videogrpo")
    try:
        archives, tasks, samples = generate(root, args.mb, args.archives)
        archive_dir = archives[0].parent.parent
        total = sum(a.stat().st_size for a in archives)
        upstream = fetch_manifest(root, archive_dir)
        (root / "tasks.txt").write_text("\n".join(tasks) + "\n")
        config = {
            "data": {
                "source": "hub",
                "repo_id": "bench/archives",
                "revision": "0" * 40,
                "task_list": str(root / "tasks.txt"),
                "samples_per_task": samples,
                "heldout_per_task": 0,
            }
        }
        (root / "config.json").write_text(json.dumps(config))
        names = " ".join(str(a) for a in archives)

        def stage(workers: int) -> list[str]:
            return [
                videogrpo,
                "stage",
                "materialize-dataset",
                "--config-json",
                f"@{root / 'config.json'}",
                "--archives",
                str(archive_dir),
                "--out",
                str(root / "out/dataset"),
                "--workers",
                str(workers),
                "--upstream",
                str(upstream),
                "--manifest",
                str(root / "out/materialize.manifest.json"),
            ]

        commands = {
            "videogrpo stage materialize-dataset --workers 2": (stage(2), False),
            "videogrpo stage materialize-dataset --workers 1": (stage(1), False),
            "tar -xzf, one archive at a time": (f"for a in {names}; do tar -xzf $a; done", True),
            "tar -xzf, two at a time": (f"printf '%s\\n' {names} | xargs -P 2 -n 1 tar -xzf", True),
            "tar -xzf + sha256sum of every file": (
                f"for a in {names}; do tar -xzf $a; done && find . -type f -print0 | xargs -0 sha256sum > /dev/null",
                True,
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, (command, shell) in commands.items():
                times[name].append(timed(command, root / "out", shell=shell))
        digest_rates = tree_digest_rates(root, stage(2), args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median = {name: statistics.median(t) for name, t in times.items()}
    base = median["tar -xzf, one archive at a time"]
    print(
        f"{len(archives)} archives, {total / 2**20:.0f} MiB compressed, {len(tasks) * samples} samples "
        f"({len(tasks) * samples * 5} files unpacked); median of {args.repeats} runs each, interleaved; "
        f"{len(os.sched_getaffinity(0))} CPUs"
    )
    print("\n| command | seconds (median) | spread of identical runs | / tar one at a time |")
    print("|---|---|---|---|")
    for name, seconds in median.items():
        spread = (max(times[name]) - min(times[name])) / seconds
        print(f"| {name} | {seconds:.2f} | {100 * spread:.0f}% | {seconds / base:.2f} |")
    print("\n| tree digest | MB/s (median) | / hashlib in memory |")
    print("|---|---|---|")
    for name, rate in digest_rates.items():
        print(f"| {name} | {rate:.0f} | {rate / digest_rates['hashlib.sha256 over the bytes in memory']:.2f} |")


def tree_digest_rates(root: Path, stage: list[str], repeats: int) -> dict[str, float]:
    from videogrpo.provenance import digest

    timed(stage, root / "out")
    raw = root / "out/dataset/raw"
    files = digest.list_files(raw)
    blobs = [(raw / rel).read_bytes() for rel in files]
    size = sum(len(b) for b in blobs) / 1e6
    rates: dict[str, list[float]] = {
        "hashlib.sha256 over the bytes in memory": [],
        "digest.tree_digest (default threads)": [],
        "digest.tree_digest (one thread)": [],
    }
    for _ in range(repeats):
        start = time.perf_counter()
        for blob in blobs:
            hashlib.sha256(blob).hexdigest()
        rates["hashlib.sha256 over the bytes in memory"].append(size / (time.perf_counter() - start))
        start = time.perf_counter()
        digest.tree_digest_of_entries(digest.tree_entries(raw))
        rates["digest.tree_digest (default threads)"].append(size / (time.perf_counter() - start))
        start = time.perf_counter()
        digest.tree_digest_of_entries(digest.tree_entries(raw, threads=1))
        rates["digest.tree_digest (one thread)"].append(size / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


if __name__ == "__main__":
    main()
