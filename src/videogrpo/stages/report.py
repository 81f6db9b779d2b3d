"""report: every manifest merged into provenance.json, and an HTML page with the reward curve and table (both
also logged to the run's MLflow run where logging.tracker lists mlflow)."""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

from videogrpo import atomic
from videogrpo.grpo.mlflow_run import log_stage_outputs
from videogrpo.provenance.crate import write_run_crate
from videogrpo.provenance.manifest import StageRun
from videogrpo.provenance.report_page import build_provenance, render_html
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--run-id", required=True)
    parser.add_argument(
        "--stage-manifest",
        action="append",
        default=[],
        metavar="STAGE=PATH",
        help="a stage's manifest (repeat for every stage)",
    )
    parser.add_argument("--metrics", required=True, type=Path, help="training metrics (JSON lines)")
    parser.add_argument("--table", required=True, type=Path, help="evaluation per-task table (CSV)")
    parser.add_argument("--matrix", type=Path, help="the evaluation matrix (CSV), when the run has one")
    parser.add_argument("--provenance", required=True, type=Path, help="provenance.json to create")
    parser.add_argument("--html", required=True, type=Path, help="report.html to create")
    parser.add_argument("--crate", required=True, type=Path, help="the run's ro-crate-metadata.json (run dir root)")
    parser.add_argument("--invocation", type=Path, help="the config files and --config overrides as given (JSON)")


def evaluation_videos(provenance: dict, html: Path) -> dict[str, list[str]]:
    """The evaluate stage's videos by variant, as paths relative to the report page."""
    record = provenance["stages"].get("evaluate", {}).get("outputs", {}).get("videos")
    if not record:
        return {}
    found: dict[str, list[str]] = {}
    for rel in sorted(record.get("entries", {})):
        found.setdefault(rel.split("/")[0], []).append(os.path.relpath(Path(record["path"]) / rel, html.parent))
    return found


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    manifests = dict(item.split("=", 1) for item in args.stage_manifest)
    manifests = {name: Path(path) for name, path in manifests.items()}
    # Every stage's manifest is upstream: the metrics and the table must be what train and evaluate made.
    with StageRun(
        "report",
        args.manifest,
        inputs=dict(
            manifests, metrics=args.metrics, table=args.table, **({"matrix": args.matrix} if args.matrix else {})
        ),
        params=sections,
        upstream=[*manifests.values(), *args.upstream],
    ) as stage:
        provenance = build_provenance(
            manifests, args.run_id, json.loads(args.invocation.read_text()) if args.invocation else {}
        )
        metrics = [json.loads(line) for line in args.metrics.read_text().splitlines() if line]
        with open(args.table, newline="") as f:
            table = list(csv.DictReader(f))
        matrix = None
        if args.matrix:
            with open(args.matrix, newline="") as f:
                matrix = list(csv.DictReader(f))
        atomic.write_json(args.provenance, provenance)
        atomic.write_text(
            args.html, render_html(provenance, metrics, table, evaluation_videos(provenance, args.html), matrix)
        )
        stage.output("provenance", args.provenance)
        stage.output("html", args.html)
        stage.output("crate", write_run_crate(args.crate.parent, provenance))
        log_stage_outputs(cfg.logging, args.run_id, "report", [args.html, args.provenance])
    print(f"report: {args.html.resolve()}")
    return 0
