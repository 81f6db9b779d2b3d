"""evaluate: samples of evaluate.split rolled out with the trained (and base) transformer, scored, tabulated.

Scored batches are kept in <records>/<key>/ (outside the declared outputs, which Snakemake deletes before
a rerun), keyed by the stage's config and the digests of its inputs: an interrupted evaluation resumes
with the batches it has not scored yet, and records made for other weights or settings are never reused.
Where logging.tracker lists mlflow, the two tables are also artifacts of the run's MLflow run (mlflow_run.py).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from videogrpo import atomic
from videogrpo.grpo.mlflow_run import log_stage_outputs
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config, resume_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--model", required=True, type=Path, help="base model directory")
    parser.add_argument("--final", required=True, type=Path, help="train's final checkpoint directory")
    parser.add_argument("--dataset", required=True, type=Path, help="materialized dataset directory")
    parser.add_argument("--evalkit", required=True, type=Path, help="EvalKit checkout")
    parser.add_argument("--scores", required=True, type=Path, help="per-sample scores (CSV) to create")
    parser.add_argument("--table", required=True, type=Path, help="per-task table (CSV) to create")
    parser.add_argument("--videos", required=True, type=Path, help="directory for the scored videos")
    parser.add_argument("--records", required=True, type=Path, help="where scored batches are kept for a resume")
    parser.add_argument("--run-id", help="the run identity: the MLflow run its tables go to (logging.tracker)")


def run(args: argparse.Namespace) -> int:
    import torch

    from videogrpo.evaluation.heldout import evaluate

    cfg, sections = load_config(args)
    torch.set_num_threads(cfg.parallel.cpu_threads)  # CPU results depend on the thread count
    device = torch.device("cuda", 0) if cfg.parallel.device == "cuda" else torch.device("cpu")
    inputs = {
        "model": args.model,
        "final": args.final,
        "dataset": args.dataset / "raw",
        "splits": args.dataset / "splits.json",
        "evalkit": args.evalkit,
    }
    external = ("evalkit",)  # pinned by evalkit.digest, which fingerprint_evalkit checks
    with StageRun(
        "evaluate", args.manifest, inputs=inputs, params=sections, upstream=args.upstream, external=external
    ) as stage:
        records = args.records / resume_key("evaluate", sections, stage)
        with atomic.atomic_directory(args.videos) as videos_tmp:
            scores, table = evaluate(
                cfg, args.model, args.final, args.dataset, args.evalkit, videos_tmp, device, records
            )
        for stale in args.records.iterdir():  # records of other weights or settings: never resumed
            if stale != records:
                shutil.rmtree(stale, ignore_errors=True)
        with atomic.atomic_path(args.scores) as tmp:
            scores.to_csv(tmp, index=False)
        with atomic.atomic_path(args.table) as tmp:
            table.to_csv(tmp, index=False)
        for name, path in (("scores", args.scores), ("table", args.table), ("videos", args.videos)):
            stage.output(name, path)
        stage.summary = {"overall": table[table.task == "ALL"].iloc[0].to_dict()}
        log_stage_outputs(cfg.logging, args.run_id, "evaluate", [args.table, args.scores])
    return 0
