"""validate_dataset: every sample complete, every video decodes with the expected shape, counts match."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from videogrpo import atomic
from videogrpo.config import read_task_list
from videogrpo.data.validate import validate
from videogrpo.errors import DigestMismatch
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--dataset", required=True, type=Path, help="directory materialize_dataset wrote")
    parser.add_argument("--out", required=True, type=Path, help="validation report (JSON)")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="video-decoding processes, at most the CPUs this process may use (0: all of them)",
    )


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    d = cfg.data
    inputs = {
        "dataset_index": args.dataset / "dataset.json",
        "splits": args.dataset / "splits.json",
        "materialization": args.dataset / "materialization.json",
        "raw": args.dataset / "raw",
    }
    with StageRun("validate_dataset", args.manifest, inputs=inputs, params=sections, upstream=args.upstream) as stage:
        usable = len(os.sched_getaffinity(0))
        workers = max(1, min(args.workers or usable, usable))
        report = validate(
            args.dataset,
            read_task_list(d.task_list),
            d.samples_per_task,
            d.gt_frames,
            d.gt_height,
            d.gt_width,
            workers=workers,
        )
        report["raw_tree_sha256"] = stage.input_records["raw"]["tree_sha256"]
        recorded = json.loads((args.dataset / "materialization.json").read_text()).get("raw_tree_sha256")
        if recorded != report["raw_tree_sha256"]:
            raise DigestMismatch(
                f"{args.dataset / 'raw'}: tree SHA-256 {report['raw_tree_sha256']} differs from {recorded} in "
                f"{args.dataset / 'materialization.json'}; rerun materialize_dataset with data.verify_existing: true"
            )
        atomic.write_json(args.out, report)
        stage.output("validation", args.out)
        stage.summary = {k: report[k] for k in ("tasks", "samples", "raw_tree_sha256")}
    return 0
