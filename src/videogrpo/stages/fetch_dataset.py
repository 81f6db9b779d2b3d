"""fetch_dataset: the dataset archives, pinned (hub) or generated (synthetic), and their manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic
from videogrpo.artifacts import hub
from videogrpo.config import read_task_list
from videogrpo.errors import ConfigError
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="directory to hold the archives")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    d = cfg.data
    inputs = {"task_list": d.task_list} if d.source == "synthetic" else {}
    known = None  # (sha256, size) per file where the download already hashed it
    external = ("task_list",)  # a file of the checkout
    with StageRun(
        "fetch_dataset", args.manifest, inputs=inputs, params=sections, upstream=args.upstream, external=external
    ) as stage:
        if d.source == "synthetic":
            from videogrpo.demo import synthetic_dataset

            tasks = read_task_list(d.task_list)

            if None in (d.gt_frames, d.gt_height, d.gt_width):
                raise ConfigError(
                    "data.gt_frames, data.gt_height, data.gt_width: the synthetic generator needs "
                    "all three (they are the size of the videos it writes)"
                )
            archive_dir = d.archive_glob.split("/")[0]
            with atomic.atomic_directory(args.out) as tmp:
                synthetic_dataset.generate(
                    tmp,
                    tasks,
                    d.samples_per_task,
                    d.synthetic_seed,
                    d.gt_frames,
                    d.gt_height,
                    d.gt_width,
                    fps=synthetic_dataset.FPS,
                    archive_dir=archive_dir,
                    progress=print,
                )
            stage.summary = {"source": "synthetic", "tasks": len(tasks), "samples_per_task": d.samples_per_task}
        else:
            known = hub.snapshot(d.repo_id, d.revision, args.out, repo_type="dataset", allow_patterns=[d.archive_glob])
            stage.summary = {"source": "hub", "repo_id": d.repo_id, "revision": d.revision}
        stage.output("archives", args.out, known=known)
    print(f"archives ready: {args.out}")
    return 0
