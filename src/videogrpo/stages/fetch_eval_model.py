"""fetch_eval_model: a pinned Hub pipeline to evaluate (matrix.hub_models), downloaded and validated.

A local rule (the login node, where the downloads run): the validation reads safetensors headers, sizes, index
shards and the shapes each component's config implies, and loads only the weightless tokenizer and scheduler
(matrix/models.validate_pipeline), so a 5B pipeline is validated in seconds without its weights in memory; the
first full load is generate_cell's, on a GPU node.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from videogrpo.artifacts import hub
from videogrpo.evaluation.pipelines import parse_hub_model, validate_pipeline
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--name", required=True, help="the model's name in matrix.hub_models")
    parser.add_argument("--spec", required=True, help="its repo_id@revision (matrix.hub_models[name])")
    parser.add_argument("--out", required=True, type=Path, help="pipeline directory to create")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    repo_id, revision = parse_hub_model(args.name, args.spec)
    with StageRun("fetch_eval_model", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        known = hub.snapshot(repo_id, revision, args.out, repo_type="model")
        try:
            record = validate_pipeline(args.out, cfg.matrix.pipeline_sha256)
        except Exception:
            shutil.rmtree(args.out, ignore_errors=True)  # never left where the next attempt would trust it
            raise
        stage.output("model", args.out, known=known)
        stage.summary = {"name": args.name, "repo_id": repo_id, "revision": revision, "validation": record}
    print(f"{args.name}: {repo_id}@{revision} validated ({len(record['components'])} components)")
    return 0
