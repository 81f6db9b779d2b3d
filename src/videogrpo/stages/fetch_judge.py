"""fetch_judge: the VLM judge model (reward.judge_model at reward.judge_revision), pinned, and its manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo.artifacts import hub
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="judge model directory to create")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    r = cfg.reward
    with StageRun("fetch_judge", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        known = hub.snapshot(r.judge_model, r.judge_revision, args.out, repo_type="model")
        stage.summary = {"repo_id": r.judge_model, "revision": r.judge_revision}
        stage.output("judge", args.out, known=known)
    print(f"judge model ready: {args.out}")
    return 0
