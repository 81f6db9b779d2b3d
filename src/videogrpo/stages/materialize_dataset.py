"""materialize_dataset: safe streaming unpack into raw/, plus dataset.json, splits.json, materialization.json.

raw/ is deliberately not a declared Snakemake output: Snakemake deletes declared outputs before a
rerun and after a failure, and an interrupted unpack of 10 GB must resume. The manifest still records
raw/ file by file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path, PurePosixPath

from videogrpo.config import read_task_list
from videogrpo.data.materialize import materialize
from videogrpo.errors import DigestMismatch
from videogrpo.provenance.manifest import StageRun, upstream_outputs
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--archives", required=True, type=Path, help="directory fetch_dataset filled")
    parser.add_argument("--out", required=True, type=Path, help="directory for raw/ and the index files")
    parser.add_argument(
        "--workers", type=int, default=0, help="archives unpacked at once, one process each (0: the CPUs this job has)"
    )
    parser.add_argument(
        "--verify-existing",
        action="store_true",
        help="hash every kept file against its archive's record instead of trusting size and mtime "
        "(also set by data.verify_existing)",
    )


def fetched_archives(archives_dir: Path, upstream: list[Path]) -> tuple[dict[str, tuple[str, int]], str]:
    """(sha256, size) per archive name as the fetch manifest recorded them, and where that record is.

    Without that record no archive's SHA-256 could be checked, so its absence is an error, never a skip.
    """
    match = upstream_outputs(upstream).get(os.path.abspath(archives_dir))
    if match is None or "entries" not in match[0]:
        looked_in = ", ".join(str(p) for p in upstream) or "none (no --upstream given)"
        found = "records no file list for it" if match else "records no output at that path"
        raise DigestMismatch(
            f"{archives_dir}: no fetch_dataset record of these archives, so their SHA-256 cannot be checked before "
            f"the unpack; manifests looked in: {looked_in} ({found}). Give fetch_dataset's manifest with "
            f"--upstream (the workflow rule does), with --archives the directory it fetched into, or rerun "
            f"fetch_dataset (snakemake --forcerun fetch_dataset)"
        )
    record, manifest_path, stage = match
    expected = {PurePosixPath(rel).name: (sha, size) for rel, (sha, size) in record["entries"].items()}
    return expected, f"{stage} ({manifest_path})"


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    d = cfg.data
    tasks = read_task_list(d.task_list)
    pattern = d.archive_glob
    workers = args.workers or len(os.sched_getaffinity(0))
    with StageRun("materialize_dataset", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        archives = sorted(args.archives.glob(pattern))
        source = {
            "repo": d.repo_id if d.source == "hub" else "synthetic",
            "revision": d.revision if d.source == "hub" else None,
            "archive_glob": pattern,
        }
        expected, expected_from = fetched_archives(args.archives, stage.upstream)
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
            expected=expected,
            expected_from=expected_from,
            workers=workers,
            max_member_bytes=int(d.max_member_mb * 2**20),
            inflater=d.inflater,
        )
        by_name = result.archive_entries
        stage.input(
            "archives",
            args.archives,
            known={a.relative_to(args.archives).as_posix(): by_name[a.name] for a in archives},
        )
        stage.output("raw", args.out / "raw", known=result.raw_entries, complete=True)  # listed by the unpack
        for name in ("dataset.json", "splits.json", "materialization.json"):
            stage.output(name, args.out / name)
        stage.summary = result.record["counts"]
    return 0
