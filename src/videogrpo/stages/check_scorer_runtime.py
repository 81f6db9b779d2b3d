"""check_scorer_runtime: the scorer interpreter's packages against the EvalKit runtime contract."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic
from videogrpo.config import runtime_contract
from videogrpo.provenance.manifest import StageRun
from videogrpo.rewards.scorer_process import check_runtime
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--fingerprint", required=True, type=Path, help="fingerprint_evalkit's record")
    parser.add_argument("--out", required=True, type=Path, help="runtime record (JSON)")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    with StageRun(
        "check_scorer_runtime",
        args.manifest,
        inputs={"fingerprint": args.fingerprint},
        params=sections,
        upstream=args.upstream,
    ) as stage:
        # In the checkout, as the scorer workers start: the probe sees what they will see.
        record = check_runtime(runtime_contract(cfg), cfg.evalkit.python or None, cfg.evalkit.path)
        atomic.write_json(args.out, record)
        stage.output("runtime", args.out)
        stage.summary = {"fingerprint": record["fingerprint"]}
    print(f"scorer runtime matches evalkit.runtime: fingerprint {record['fingerprint']}")
    return 0
