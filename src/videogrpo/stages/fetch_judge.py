"""fetch_judge: the VLM judge model (reward.judge_model at reward.judge_revision), pinned, and its manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo.artifacts import hub
from videogrpo.errors import VideoGRPOError
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config

# What a run can score with when the judge model cannot be fetched (no Hub here), or cannot be served (the tiny
# default on a CPU): a judge service that already runs, named by reward.judge_endpoint, which needs no download.
WITHOUT_THE_HUB = (
    "Without this download, name a judge service that runs (reward.judge_endpoint: no download then). On the tiny "
    "default, the stand-in judge answers as vLLM does: `python -m videogrpo.demo.stand_in_judge --port 18080 &`, "
    "then --config 'reward={kind: vbvr_vlm, judge_endpoint: http://127.0.0.1:18080}'. Or train on the rule "
    "reward (reward.kind vbvr_rule: the tiny default's, with its stand-in EvalKit)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="judge model directory to create")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    r = cfg.reward
    with StageRun("fetch_judge", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        try:
            known = hub.snapshot(r.judge_model, r.judge_revision, args.out, repo_type="model")
        except VideoGRPOError as err:
            raise VideoGRPOError(f"{err}\n{WITHOUT_THE_HUB}") from None
        stage.summary = {"repo_id": r.judge_model, "revision": r.judge_revision}
        stage.output("judge", args.out, known=known)
    print(f"judge model ready: {args.out}")
    return 0
