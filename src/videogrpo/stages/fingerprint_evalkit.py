"""fingerprint_evalkit: the EvalKit source digest, compared with the one pinned in config."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic
from videogrpo.provenance.manifest import StageRun
from videogrpo.rewards.evalkit import check_checkout, fingerprint
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="fingerprint record (JSON)")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    check_checkout(cfg.evalkit.path)  # before the manifest describes it: name the field, not a missing path
    with StageRun(
        "fingerprint_evalkit",
        args.manifest,
        inputs={"evalkit": cfg.evalkit.path},
        params=sections,
        upstream=args.upstream,
        external=("evalkit",),  # the checkout this stage pins
    ) as stage:
        record = fingerprint(cfg.evalkit.path, cfg.evalkit.digest, cfg.evalkit.easyocr_models)
        atomic.write_json(args.out, record)
        stage.output("fingerprint", args.out)
        stage.summary = {"source_sha256": record["source_sha256"], "files": record["files"]}
    print(f"EvalKit {cfg.evalkit.path}: source digest {record['source_sha256']} matches evalkit.digest")
    return 0
