"""fetch_model: the base Diffusers pipeline directory, pinned (hub) or built (tiny), and its manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic, hub
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="model directory to create")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    m = cfg.model
    known = None  # (sha256, size) per file where the download already hashed it
    with StageRun("fetch_model", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        if m.source == "tiny":
            from videogrpo.models.tiny import save_tiny_pipeline

            with atomic.atomic_directory(args.out) as tmp:
                save_tiny_pipeline(tmp, m.tiny_seed)
            stage.summary = {"source": "tiny", "seed": m.tiny_seed}
        else:
            known = hub.snapshot(m.repo_id, m.revision, args.out, repo_type="model")
            stage.summary = {"source": "hub", "repo_id": m.repo_id, "revision": m.revision}
        stage.output("model", args.out, known=known)
    print(f"model ready: {args.out}")
    return 0
