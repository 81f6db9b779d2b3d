"""Benchmark: how planning the release pipeline grows with the evaluation tree's items and the matrix's cells.

    .venv/bin/python bench/bench_dag.py [--items 50 500 5000] [--samplers 6 24 96] [--hub-models 8 32]
                                        [--repeats 3] [--smoke]

In one invocation, on a copy of the checkout: `snakemake -n` of the whole pipeline (the default target:
training, the matrix, the report) of config/recipes/rl_5b_cps.yaml with each matrix preset
(config/matrix/release.yaml: base and trained; published_5b.yaml: the two published checkpoints) over an
external evaluation tree synthesized in the release layout (`<domain>/<task>/<index>/` with its four files,
and split_manifest.json; at most 100 tasks, half of them Out-of-Domain_50). The files hold a few bytes:
planning lists the tree (every file is an input of eval_set) and reads none of it. Then, over the
`--cells-items` tree, the matrix grows: more samplers (both presets), more Hub models (published).
No results directory exists before a dry run, and the benchmark fails if one exists after it: every run
plans from scratch and writes nothing. Runs are interleaved over `--repeats`; medians of wall and CPU time are
printed with the spread between identical runs, beside the same command on a one-rule Snakefile (Snakemake's
own start). Last, the listing of each tree that eval_set's inputs take at every parse, in this process: the
digest's scandir walk the workflow uses, against pathlib's rglob, which it used before. Record the output in
bench/RESULTS.md. `--smoke`: the 50-item tree, the presets' own cells, one repeat (what the tests run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_dryrun import ONE_RULE, copy_checkout

RECIPE = "config/recipes/rl_5b_cps.yaml"
PRESETS = ("release", "published_5b")
DOMAINS = ("In-Domain_50", "Out-of-Domain_50")
SAMPLE_FILES = ("first_frame.png", "prompt.txt", "ground_truth.mp4")
DIGEST = "ab" * 32  # never checked by a dry run (eval_set checks it when it runs)


def synthesize_tree(root: Path, items: int) -> int:
    """A tree in the release evaluation layout holding `items` samples; returns its number of files."""
    tasks = min(100, items)
    records = []
    for t in range(tasks):
        task, domain = f"B-{t}_bench_task_data-generator", DOMAINS[t >= tasks // 2]
        bench = []
        for index in range(items // tasks + (t < items % tasks)):
            sample_id = f"{task}_{index:05d}"
            sample = root / domain / task / f"{index:05d}"
            sample.mkdir(parents=True)
            for name in SAMPLE_FILES:
                (sample / name).write_bytes(b"\0")
            (sample / "metadata.json").write_text(json.dumps({"task_id": sample_id}))
            bench.append(sample_id)
        records.append({"task": task, "split": domain, "bench": bench})
    (root / "split_manifest.json").write_text(json.dumps(records))
    return 4 * items + 1


def matrix_override(work: Path, tree: Path, preset: str, samplers: int, models: int) -> dict:
    """The matrix fields a configuration file adds to the recipe and preset: the tree, and more cells (the recipe's
    samplers, then Flow-CPS at other noise levels; the published models, then other pinned Hub models)."""
    recipe = yaml.safe_load((work / RECIPE).read_text())["matrix"]["samplers"]
    extra = [f"flowcps-0.{i:03d}" for i in range(1, 1 + samplers - len(recipe))]
    matrix = {"eval_set": str(tree), "eval_set_digest": DIGEST, "samplers": recipe + extra}
    if preset == "published_5b" and models > 2:
        published = yaml.safe_load((work / f"config/matrix/{preset}.yaml").read_text())["matrix"]
        more = {f"bench_{i}": f"bench/model-{i}@{i:040x}" for i in range(models - 2)}
        matrix["hub_models"] = {**published["hub_models"], **more}
        matrix["models"] = [*published["models"], *more]
    return {"matrix": matrix}


def dry_run(work: Path, configfiles: list[str]) -> tuple[tuple[float, float], dict[str, int]]:
    """(wall seconds, CPU seconds) of one `snakemake -n` in `work`, and the jobs it planned by rule (with `total`, and
    `eval_set inputs`: the files of eval_set's input line). CPU time (user and system, of the process and the
    children it waited for) moves less than wall time on a machine others share."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    argv = ["snakemake", "-n", "--configfile", *configfiles] if configfiles else ["snakemake", "-n", "--cores", "1"]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if out.returncode:
        raise SystemExit(f"{' '.join(argv)} failed in {work}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    if (work / "results").exists():
        raise SystemExit(f"{' '.join(argv)} wrote {work / 'results'}: a dry run must write nothing")
    stats = out.stdout.split("Job stats:")[-1]
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}
    inputs = re.search(r"^rule eval_set:\n\s+input: (.*)$", out.stdout, re.M)
    jobs["eval_set inputs"] = len(inputs[1].split(", ")) if inputs else 0
    return (seconds, cpu), jobs


def listing_times(tree: Path, repeats: int) -> tuple[float, float]:
    """Median seconds of listing the tree as eval_tree_inputs (workflow/rules/common.smk) does at every parse, by the
    digest's scandir walk, and as it did before, by pathlib's rglob and a stat per path."""
    from videogrpo.provenance.digest import list_files

    scandir, rglob = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        listed = [str(tree / rel) for rel in list_files(tree)]
        scandir.append(time.perf_counter() - start)
        start = time.perf_counter()
        globbed = [str(path) for path in sorted(tree.rglob("*")) if path.is_file()]
        rglob.append(time.perf_counter() - start)
        assert sorted(listed) == globbed, "the two listings differ"
    return statistics.median(scandir), statistics.median(rglob)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[50, 500, 5000], help="evaluation tree sizes")
    parser.add_argument("--cells-items", type=int, default=500, help="the tree size of the cells table")
    parser.add_argument("--samplers", type=int, nargs="+", default=[6, 24, 96], help="matrix.samplers lengths")
    parser.add_argument("--hub-models", type=int, nargs="+", default=[8, 32], help="published models (6 samplers)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every command (the median is printed)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 50 items, the presets' cells, once")
    args = parser.parse_args()
    if args.smoke:
        args.items, args.cells_items, args.samplers, args.hub_models, args.repeats = [50], 50, [6], [], 1
    root = Path(tempfile.mkdtemp(prefix="videogrpo-dag-"))
    try:
        work = copy_checkout(root / "checkout")
        baseline = root / "one-rule"
        baseline.mkdir()
        (baseline / "Snakefile").write_text(ONE_RULE)
        files = {}
        for items in sorted({*args.items, args.cells_items}):
            files[items] = synthesize_tree(root / f"tree-{items}", items)
        # (preset, items, samplers, models): one dry run's configuration; the tables share the ones they have in
        # common (the presets' own cells over the cells table's tree).
        items_table = [(preset, items, 6, 2) for items in args.items for preset in PRESETS]
        cells_table = [(preset, args.cells_items, n, 2) for preset in PRESETS for n in args.samplers]
        cells_table += [("published_5b", args.cells_items, 6, n) for n in args.hub_models]
        configs = list(dict.fromkeys(items_table + cells_table))
        for i, (preset, items, samplers, models) in enumerate(configs):
            override = matrix_override(work, root / f"tree-{items}", preset, samplers, models)
            (root / f"matrix-{i}.yaml").write_text(yaml.safe_dump(override))
        times: dict[tuple, list[tuple[float, float]]] = {config: [] for config in configs}
        jobs: dict[tuple, dict[str, int]] = {}
        one_rule = []
        for _ in range(args.repeats):
            one_rule.append(dry_run(baseline, [])[0])
            for i, config in enumerate(configs):
                configfiles = [RECIPE, f"config/matrix/{config[0]}.yaml", str(root / f"matrix-{i}.yaml")]
                measured, jobs[config] = dry_run(work, configfiles)
                times[config].append(measured)
                if jobs[config]["eval_set inputs"] != files[config[1]]:  # the tree as the workflow lists it
                    raise SystemExit(
                        f"eval_set plans {jobs[config]['eval_set inputs']} inputs; the tree holds {files[config[1]]}"
                    )
        listing = {items: listing_times(root / f"tree-{items}", args.repeats) for items in args.items}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(t[0] for t in one_rule)
    base_cpu = statistics.median(t[1] for t in one_rule)
    print(
        f"`snakemake -n` of {RECIPE} with a matrix preset over a synthesized external evaluation tree, fresh results "
        f"directory; median of {args.repeats} runs each, interleaved; {len(os.sched_getaffinity(0))} CPUs; "
        f"the same command on a one-rule Snakefile: {base:.2f} s ({base_cpu:.2f} s CPU)"
    )

    def row(config: tuple, *first: object) -> str:
        wall, cpu = [t[0] for t in times[config]], [t[1] for t in times[config]]
        median = statistics.median(wall)
        spread = (max(wall) - min(wall)) / median
        cols = [
            *first,
            jobs[config].get("generate_cell", 0),
            jobs[config]["total"],
            f"{median:.2f} s",
            f"{100 * spread:.0f}%",
            f"{statistics.median(cpu):.2f} s",
            f"{statistics.median(cpu) - base_cpu:.2f} s",
        ]
        return "| " + " | ".join(str(c) for c in cols) + " |"

    print("\nItems: the external evaluation tree's samples (4 files each, and the split manifest: eval_set's inputs)\n")
    print("| preset | items | eval_set inputs | cells | jobs | dry run | spread | CPU time | CPU over one-rule |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config in items_table:
        print(row(config, config[0], config[1], files[config[1]]))
    print(f"\nCells: matrix.models x matrix.samplers and the held-out check, over the {args.cells_items}-item tree\n")
    print("| preset | models | samplers | cells | jobs | dry run | spread | CPU time | CPU over one-rule |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config in cells_table:
        print(row(config, config[0], config[3], config[2]))
    print("\nListing the tree as eval_set's inputs, at every parse (in this process, median seconds)\n")
    print("| items | files | digest.list_files (scandir) | pathlib rglob + is_file | rglob / scandir |")
    print("|---|---|---|---|---|")
    for items, (scandir, rglob) in listing.items():
        print(f"| {items} | {files[items]} | {scandir:.3f} | {rglob:.3f} | {rglob / scandir:.2f} |")


if __name__ == "__main__":
    main()
