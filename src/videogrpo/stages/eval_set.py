"""eval_set: the evaluation list of a pinned evaluation tree, its exact set checked, final frames extracted.

An external tree (matrix.eval_set) must have the tree digest matrix.eval_set_digest pins: an edited sample
or split manifest is refused with both digests. Consumers re-check the files they read against the
SHA-256s recorded in samples.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import atomic
from videogrpo.errors import ConfigError, DigestMismatch
from videogrpo.evaluation.evalset import MANIFEST, SAMPLE_FILES, eval_samples, last_frame
from videogrpo.provenance.digest import tree_digest_of_entries, tree_entries
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--tree", required=True, type=Path, help="the evaluation tree")
    parser.add_argument("--samples", required=True, type=Path, help="the evaluation list (JSON) to create")
    parser.add_argument("--final-frames", required=True, type=Path, help="directory of ground-truth final frames")


def run(args: argparse.Namespace) -> int:
    from PIL import Image

    cfg, sections = load_config(args)
    m = cfg.matrix
    if not args.tree.is_dir():
        field = "matrix.eval_set" if m.eval_set else "the synthetic tree (synthesize_eval_set)"
        raise ConfigError(
            f"{field} = {str(args.tree)!r}: no such directory; point matrix.eval_set at the release evaluation tree "
            f"(In-Domain_50/, Out-of-Domain_50/ and split_manifest.json) and pin matrix.eval_set_digest"
        )
    external = ("tree",) if m.eval_set else ()  # a released tree, pinned by matrix.eval_set_digest below
    with StageRun(
        "eval_set", args.manifest, inputs={}, params=sections, upstream=args.upstream, external=external
    ) as stage:
        entries = tree_entries(args.tree)
        stage.input("tree", args.tree, known=entries)
        tree_sha256 = tree_digest_of_entries(entries)
        if m.eval_set and tree_sha256 != m.eval_set_digest:
            raise DigestMismatch(
                f"{args.tree}: tree SHA-256 {tree_sha256}, but matrix.eval_set_digest pins "
                f"{m.eval_set_digest} ({MANIFEST} SHA-256 {entries.get(MANIFEST, ('absent',))[0]}); "
                f"the evaluation set or its split manifest changed: restore it, or pin the new digest knowingly"
            )
        samples = eval_samples(args.tree, m.expected_samples)
        listed = [
            {**s.to_dict(), "name": s.name, "files": {f: entries[f"{s.name}/{f}"][0] for f in SAMPLE_FILES}}
            for s in samples
        ]
        with atomic.atomic_directory(args.final_frames) as tmp:
            for s in samples:
                target = tmp / f"{s.name}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(last_frame(args.tree / s.name / "ground_truth.mp4")).save(target)
        atomic.write_json(args.samples, {"tree": str(args.tree.resolve()), "samples": listed})
        stage.output("samples", args.samples)
        stage.output("final_frames", args.final_frames)
        domains = sorted({s.domain for s in samples})
        stage.summary = {
            "samples": len(samples),
            "tasks": len({s.task for s in samples}),
            "per_domain": {d: sum(s.domain == d for s in samples) for d in domains},
            "tree_sha256": tree_sha256,
        }
    print(f"evaluation set: {len(samples)} samples, exactly those of {args.tree / MANIFEST}")
    return 0
