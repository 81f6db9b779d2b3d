"""Benchmark: generation and scoring throughput of one evaluation-matrix cell on the tiny model.

    .venv/bin/python bench/bench_matrix.py [--per-task 4] [--repeats 2] [--samplers unipc euler flowcps-0.7] [--smoke]

In one invocation, for the ODE samplers unipc and euler and the training sampler flowcps-0.7: the whole
`videogrpo stage generate-cell` stage (process start, model load, every video generated, validated and
promoted, its manifest) with one process and with two data-parallel processes, against the bare
generation loop of the same videos in this process (model already loaded: what the stage cannot go
below); then the whole `videogrpo stage score-cell` stage (scorer pool in the EvalKit checkout, preparation,
scoring, aggregates, manifest). Videos per second are printed with the ratios. Record the output in
bench/RESULTS.md. `--smoke`: one sample per task, the euler sampler only, one process, once (what the tests
run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SAMPLERS = ("unipc", "euler", "flowcps-0.7")
TASKS = [
    "S-1_move_red_square_data-generator",
    "S-2_fill_circle_blue_data-generator",
    "S-3_grow_bar_to_line_data-generator",
]


def stage(name: str, config: str, *args: str) -> float:
    """Wall time of one stage invocation through the CLI, given the config view the workflow would give it."""
    start = time.perf_counter()
    out = subprocess.run(
        [str(BIN / "videogrpo"), "stage", name, "--config-json", config, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}"),
    )
    if out.returncode:
        raise SystemExit(f"videogrpo stage {name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-task", type=int, default=4, help="samples per task of the evaluation tree")
    parser.add_argument("--repeats", type=int, default=2, help="runs of every measurement")
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), help="the cells' samplers")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 1 sample per task, euler, once")
    args = parser.parse_args()
    if args.smoke:
        args.per_task, args.repeats, args.samplers = 1, 1, ["euler"]
    import torch

    from videogrpo.config import Config, from_dict
    from videogrpo.demo.synthetic_eval_tree import write_synthetic_tree
    from videogrpo.demo.tiny_ti2v import save_tiny_pipeline
    from videogrpo.evaluation.evalset import load_samples
    from videogrpo.evaluation.generate import generate_rank
    from videogrpo.pipeline.stage_config import config_text
    from videogrpo.provenance.digest import tree_digest

    evalkit = REPO / "src/videogrpo/demo/stand_in_evalkit"

    def settings(tree: Path, digest: str, procs: int) -> Config:
        """The tiny default (17 frames of 64x64, 8 steps) over this tree, cells split over `procs` processes."""
        cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
        cfg["matrix"].update(
            eval_set=str(tree), eval_set_digest=digest, expected_samples=3 * args.per_task, procs=procs
        )
        cfg["evalkit"].update(path=str(evalkit), max_seconds=5.0625)
        return from_dict(cfg)

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="videogrpo-matrix-") as tmp:
        root = Path(tmp)
        model = root / "model"
        save_tiny_pipeline(model, 0)
        tree = root / "tree"
        write_synthetic_tree(tree, TASKS, args.per_task, seed=0, frames=17, height=64, width=64, fps=16)
        digest = tree_digest(tree)
        stage(
            "eval-set",
            config_text(settings(tree, digest, 1), "eval_set"),
            "--tree",
            str(tree),
            "--samples",
            str(root / "samples.json"),
            "--final-frames",
            str(root / "ff"),
            "--manifest",
            str(root / "eval_set.manifest.json"),
        )
        _, samples = load_samples(root / "samples.json")
        n = len(samples)
        cfg = settings(tree, digest, 1)
        rows = []
        for sampler in args.samplers:
            times: dict[str, list[float]] = {"loop": [], "stage 1 proc": [], "stage 2 procs": [], "score": []}
            for repeat in range(args.repeats):
                loop_dir = root / f"loop-{sampler}-{repeat}"
                from videogrpo.models.wan import WanTI2V

                WanTI2V.from_config(model, torch.device("cpu"), cfg)  # warm the file cache like the stage's
                start = time.perf_counter()
                generate_rank(0, 1, cfg, model, None, tree, samples, sampler, loop_dir, "cpu")
                times["loop"].append(time.perf_counter() - start)
                for procs in (1, 2)[: 1 if args.smoke else 2]:  # two processes start torch twice: not in a smoke
                    cell = root / f"cell-{sampler}-{procs}-{repeat}"
                    times["stage 1 proc" if procs == 1 else "stage 2 procs"].append(
                        stage(
                            "generate-cell",
                            config_text(settings(tree, digest, procs), "generate_cell"),
                            "--model",
                            str(model),
                            "--samples",
                            str(root / "samples.json"),
                            "--sampler",
                            sampler,
                            "--videos",
                            str(cell / "videos"),
                            "--work",
                            str(cell / "work"),
                            "--manifest",
                            str(cell / "m.json"),
                        )
                    )
                cell = root / f"cell-{sampler}-1-{repeat}"
                times["score"].append(
                    stage(
                        "score-cell",
                        config_text(cfg, "score_cell"),
                        "--videos",
                        str(cell / "videos"),
                        "--samples",
                        str(root / "samples.json"),
                        "--final-frames",
                        str(root / "ff"),
                        "--evalkit",
                        str(evalkit),
                        "--scores",
                        str(cell / "scores.csv"),
                        "--aggregate",
                        str(cell / "aggregate.csv"),
                        "--prepared",
                        str(cell / "prepared"),
                        "--work",
                        str(cell / "score-work"),
                        "--manifest",
                        str(cell / "s.json"),
                    )
                )
                shutil.rmtree(loop_dir)
            rows.append((sampler, {k: statistics.median(v) for k, v in times.items() if v}, times))
        print(
            f"{n} samples per cell (17 frames, 64x64, 8 steps, tiny model), {args.repeats} runs; "
            f"{os.cpu_count()} CPUs\n"
        )
        print(
            "| sampler | bare loop videos/s | stage, 1 proc | stage, 2 procs | 2 procs / 1 | loop / stage (1 proc) "
            "| score stage videos/s |"
        )
        print("|---|---|---|---|---|---|---|")
        for sampler, med, _ in rows:
            rate = {k: n / v for k, v in med.items()}
            two = rate.get("stage 2 procs")
            two_cols = f"{two:.2f} | {two / rate['stage 1 proc']:.2f}" if two else "- | -"
            print(
                f"| {sampler} | {rate['loop']:.2f} | {rate['stage 1 proc']:.2f} | {two_cols} | "
                f"{med['loop'] / med['stage 1 proc']:.2f} | {rate['score']:.2f} |"
            )
        spreads = [
            (max(v) - min(v)) / statistics.median(v) for _, _, times in rows for v in times.values() if len(v) > 1
        ]
        if spreads:
            print(f"\nlargest spread between identical runs: {max(spreads):.0%}")


if __name__ == "__main__":
    main()
