"""synthesize_eval_set: the tiny default's evaluation tree, in the release layout, with its split manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic
from videogrpo.config import read_task_list
from videogrpo.demo.synthetic_eval_tree import write_synthetic_tree
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="evaluation tree to create")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    d, m = cfg.data, cfg.matrix
    with StageRun("synthesize_eval_set", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        tasks = read_task_list(d.task_list)
        with atomic.atomic_directory(args.out) as tmp:
            write_synthetic_tree(
                tmp,
                tasks,
                m.synthetic_per_task,
                d.synthetic_seed,
                d.gt_frames or 17,
                d.gt_height or 64,
                d.gt_width or 64,
                16,
            )
        stage.output("tree", args.out)
        stage.summary = {"tasks": len(tasks), "samples": len(tasks) * m.synthetic_per_task}
    print(f"synthetic evaluation tree: {args.out}")
    return 0
