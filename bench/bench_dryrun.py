"""Benchmark: how long Snakemake takes to plan this workflow, against a one-rule Snakefile.

    .venv/bin/python bench/bench_dryrun.py [--repeats 5] [--smoke]

In one invocation, on a copy of the checkout: `snakemake -n` of the tiny default and of every
released recipe's full DAG, and a no-op rerun (`snakemake --cores 2` after a finished run: nothing to
do), each against the same command on a one-rule Snakefile in an empty directory. Prints medians of wall
and CPU time and their ratios; record the output in bench/RESULTS.md. `--smoke`: one run each of the tiny
default's and one recipe's dry run, no finished run (what the tests run, seconds).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = ("rl_5b_cps", "rl_5b_sde", "rl_5b_vlm", "rl_a14b_rule")
ONE_RULE = 'rule all:\n    output: "done.txt"\n    shell: "touch {output}"\n'


def copy_checkout(dest: Path) -> Path:
    """The checkout's files (tracked and not ignored) as a fresh clone has them: a link (the `slurm` profile) stays a
    link, not the directory it points at."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
    )
    for rel in filter(None, listed.stdout.decode().split("\0")):
        source, target = REPO / rel, dest / rel
        if source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(source), target)
        elif source.is_file():  # a file deleted but not yet staged is listed too
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def timed(argv: list[str], cwd: Path, repeats: int) -> tuple[float, float]:
    """Medians of wall and CPU seconds (user and system, of the command and the children it waited for): CPU time
    moves less than wall time on a machine others share."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    times, cpu = [], []
    for _ in range(repeats):
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(time.perf_counter() - start)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if out.returncode:
            raise SystemExit(f"{' '.join(argv)} failed in {cwd}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of every command (the median is printed)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: one repeat, two dry runs, no rerun")
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    recipes = RECIPES[:1] if args.smoke else RECIPES
    root = Path(tempfile.mkdtemp(prefix="videogrpo-dryrun-"))
    try:
        work, baseline = root / "checkout", root / "one-rule"
        copy_checkout(work)
        baseline.mkdir()
        (baseline / "Snakefile").write_text(ONE_RULE)
        one_dry = timed(["snakemake", "-n", "--cores", "1"], baseline, args.repeats)
        rows = [("tiny default", timed(["snakemake", "-n"], work, args.repeats), one_dry)]
        for recipe in recipes:
            seconds = timed(["snakemake", "-n", "--configfile", f"config/recipes/{recipe}.yaml"], work, args.repeats)
            rows.append((recipe, seconds, one_dry))
        if not args.smoke:  # the finished run this needs is the whole tiny demo: minutes
            timed(["snakemake", "--cores", "2"], work, 1)
            timed(["snakemake", "--cores", "1"], baseline, 1)
            rows.append(
                (
                    "no-op rerun of a finished run",
                    timed(["snakemake", "--cores", "2"], work, args.repeats),
                    timed(["snakemake", "--cores", "1"], baseline, args.repeats),
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"median of {args.repeats} runs each; baseline: the same command on a one-rule Snakefile")
    print("\n| command | this workflow | one-rule Snakefile | ratio | CPU: this workflow | CPU: one-rule | CPU ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, (seconds, cpu), (base, base_cpu) in rows:
        command = "snakemake -n" if "rerun" not in name else "snakemake --cores 2"
        print(
            f"| `{command}`: {name} | {seconds:.2f} s | {base:.2f} s | x{seconds / base:.2f} | {cpu:.2f} s "
            f"| {base_cpu:.2f} s | x{cpu / base_cpu:.2f} |"
        )


if __name__ == "__main__":
    main()
