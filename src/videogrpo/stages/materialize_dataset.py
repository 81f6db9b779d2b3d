"""materialize_dataset: safe streaming unpack into raw/, plus dataset.json, splits.json, materialization.json.

raw/ is deliberately not a declared Snakemake output: Snakemake deletes declared outputs before a
rerun and after a failure, and an interrupted unpack of 10 GB must resume. The manifest still records
raw/ file by file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo.config import read_task_list
from videogrpo.data.materialize import materialize
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--archives", required=True, type=Path, help="directory fetch_dataset filled")
    parser.add_argument("--out", required=True, type=Path, help="directory for raw/ and the index files")
    parser.add_argument(
        "--verify-existing",
        action="store_true",
        help="byte-compare files already unpacked instead of trusting their size (also set by data.verify_existing)",
    )


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    d = cfg.data
    tasks = read_task_list(d.task_list)
    pattern = d.archive_glob
    with StageRun(
        "materialize_dataset",
        args.manifest,
        inputs={"archives": args.archives},
        params=sections,
        upstream=args.upstream,
    ) as stage:
        archives = sorted(args.archives.glob(pattern))
        source = {
            "repo": d.repo_id if d.source == "hub" else "synthetic",
            "revision": d.revision if d.source == "hub" else None,
            "archive_glob": pattern,
        }
        result = materialize(
            archives,
            args.out,
            tasks,
            d.samples_per_task,
            d.heldout_per_task,
            d.shuffle_seed,
            d.split_name,
            source,
            verify_existing=args.verify_existing or d.verify_existing,
        )
        for name in ("raw", "dataset.json", "splits.json", "materialization.json"):
            stage.output(name, args.out / name)
        stage.summary = result["counts"]
    return 0
