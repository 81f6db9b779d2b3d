"""fetch_model: the base Diffusers pipeline directory, pinned (hub) or built (tiny), and its manifest.

The tiny builder follows model.kind: the TI2V stack (models/tiny.py) or the two-expert I2V one
(models/tiny_i2v.py), both seeded by model.tiny_seed; the manifest's summary names the kind built.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic
from videogrpo.artifacts import hub
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--out", required=True, type=Path, help="model directory to create")


def tiny_builder(kind: str):
    """The tiny generator of model.kind's layout: `save(out_dir, seed)`."""
    if kind == "i2v_a14b":
        from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline

        return save_tiny_i2v_pipeline
    from videogrpo.demo.tiny_ti2v import save_tiny_pipeline

    return save_tiny_pipeline


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    m = cfg.model
    known = None  # (sha256, size) per file where the download already hashed it
    with StageRun("fetch_model", args.manifest, inputs={}, params=sections, upstream=args.upstream) as stage:
        if m.source == "tiny":
            with atomic.atomic_directory(args.out) as tmp:
                tiny_builder(m.kind)(tmp, m.tiny_seed)
            # The kind says which layout was built: one TI2V transformer, or the two I2V experts.
            stage.summary = {"source": "tiny", "kind": m.kind, "seed": m.tiny_seed}
        else:
            known = hub.snapshot(m.repo_id, m.revision, args.out, repo_type="model")
            stage.summary = {"source": "hub", "repo_id": m.repo_id, "revision": m.revision}
        stage.output("model", args.out, known=known)
    print(f"model ready: {args.out}")
    return 0
