"""matrix: the run's evaluation tables from its scored cells. matrix.csv: every (model, sampler) cell's domain and
overall means with standard errors, bootstrap intervals and the paired change from the base model under the same
sampler; per_task.csv: the same per task and over ALL samples, the held-out check (trained against base under the
training sampler) among its rows. Both are also artifacts of the run's MLflow run where logging.tracker lists
mlflow."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from videogrpo import atomic
from videogrpo.errors import VideoGRPOError
from videogrpo.evaluation.aggregate import matrix_table, per_task_table
from videogrpo.grpo.mlflow_run import log_stage_outputs
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, add_model_arguments, load_config, model_inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--cell", action="append", default=[], metavar="MODEL:SAMPLER=SCORES_CSV", help="a scored cell (repeat)"
    )
    parser.add_argument("--table", required=True, type=Path, help="the matrix (CSV) to create")
    parser.add_argument("--per-task", required=True, type=Path, help="every cell per task (CSV) to create")
    parser.add_argument("--run-id", help="the run identity: the MLflow run its matrix goes to (logging.tracker)")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    cells: dict[tuple[str, str], Path] = {}
    for text in args.cell:
        label, _, path = text.partition("=")
        model, _, sampler = label.partition(":")
        cells[(model, sampler)] = Path(path)
    # The cells' scores, and the files of the models they evaluated: a table over weights that changed since is
    # refused, naming the file.
    inputs = {**{f"{model}:{sampler}": path for (model, sampler), path in cells.items()}, **model_inputs(args)}
    with StageRun(
        "matrix", args.manifest, inputs=inputs, params=sections, upstream=args.upstream, digest_cache=args.digest_cache
    ) as stage:
        scores = {cell: pd.read_csv(path) for cell, path in cells.items()}
        names = {cell: sorted(frame["name"]) for cell, frame in scores.items()}
        reference = next(iter(names.values()))
        differing = [f"{m}:{s}" for (m, s), listed in names.items() if listed != reference]
        if differing:
            raise VideoGRPOError(f"cells {differing} scored other samples than the first cell; rerun them")
        base = "base" if any(model == "base" for model, _ in scores) else None
        table = matrix_table(scores, base, cfg.matrix.bootstrap, cfg.matrix.seed)
        per_task = per_task_table(scores, base, cfg.matrix.bootstrap, cfg.matrix.seed)
        with atomic.atomic_path(args.table) as tmp:
            table.to_csv(tmp, index=False)
        with atomic.atomic_path(args.per_task) as tmp:
            per_task.to_csv(tmp, index=False)
        stage.output("table", args.table)
        stage.output("per_task", args.per_task)
        overall = table[table.domain == "overall"]
        stage.summary = {f"{r.model}:{r.sampler}": round(float(r["mean"]), 6) for _, r in overall.iterrows()}
        print(overall.to_string(index=False))
        log_stage_outputs(cfg.logging, args.run_id, "matrix", [args.table, args.per_task])
    return 0
