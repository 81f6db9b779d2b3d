"""eval_set: the run's one evaluation set, its exact set checked, its final frames beside it.

Two sources, one layout (evaluation/evalset.py): an external tree (matrix.eval_set, the release evaluation set),
which must have the tree digest matrix.eval_set_digest pins, so that an edited sample or split manifest is refused
with both digests; or, without one, a tree built here from the materialized dataset's matrix.split (the first
matrix.samples_per_task of each task), its inputs checked against materialize_dataset's manifest. Consumers
re-check the files they read against the SHA-256s recorded in samples.json.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from videogrpo import atomic
from videogrpo.errors import ConfigError, DigestMismatch
from videogrpo.evaluation.evalset import (
    DATASET_FILES,
    DATASET_FINAL_FRAME,
    MANIFEST,
    SAMPLE_FILES,
    dataset_samples,
    eval_samples,
    last_frame,
    write_dataset_tree,
)
from videogrpo.provenance.digest import sha256_file, tree_digest_of_entries, tree_entries
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tree", type=Path, help="the external evaluation tree (matrix.eval_set)")
    source.add_argument("--dataset", type=Path, help="the materialized dataset to build the evaluation set from")
    parser.add_argument("--out-tree", type=Path, help="with --dataset: the evaluation tree to create")
    parser.add_argument("--samples", required=True, type=Path, help="the evaluation list (JSON) to create")
    parser.add_argument("--final-frames", required=True, type=Path, help="directory of ground-truth final frames")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    if args.dataset is not None:
        if args.out_tree is None:
            raise ConfigError("eval-set --dataset: name the evaluation tree to build with --out-tree")
        return _from_dataset(args, cfg, sections)
    return _from_tree(args, cfg, sections)


def _from_tree(args: argparse.Namespace, cfg, sections: dict) -> int:
    from PIL import Image

    m = cfg.matrix
    if not args.tree.is_dir():
        raise ConfigError(
            f"matrix.eval_set = {str(args.tree)!r}: no such directory; point matrix.eval_set at the release evaluation "
            f"tree (In-Domain_50/, Out-of-Domain_50/ and split_manifest.json) and pin matrix.eval_set_digest"
        )
    with StageRun(
        "eval_set", args.manifest, inputs={}, params=sections, upstream=args.upstream, external=("tree",)
    ) as stage:
        entries = tree_entries(args.tree)
        stage.input("tree", args.tree, known=entries)
        tree_sha256 = tree_digest_of_entries(entries)
        if tree_sha256 != m.eval_set_digest:
            raise DigestMismatch(
                f"{args.tree}: tree SHA-256 {tree_sha256}, but matrix.eval_set_digest pins "
                f"{m.eval_set_digest} ({MANIFEST} SHA-256 {entries.get(MANIFEST, ('absent',))[0]}); "
                f"the evaluation set or its split manifest changed: restore it, or pin the new digest knowingly"
            )
        samples = eval_samples(args.tree, m.expected_samples)
        with atomic.atomic_directory(args.final_frames) as tmp:
            for s in samples:
                target = tmp / f"{s.name}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(last_frame(args.tree / s.name / "ground_truth.mp4")).save(target)
        _write_list(args, stage, args.tree, samples, entries)
        stage.summary = _summary(samples, tree_sha256, f"matrix.eval_set {args.tree}")
    print(f"evaluation set: {len(samples)} samples, exactly those of {args.tree / MANIFEST}")
    return 0


def _from_dataset(args: argparse.Namespace, cfg, sections: dict) -> int:
    m = cfg.matrix
    # Checked against the manifest of materialize_dataset, which recorded them: the split first, then only the
    # samples it chooses (the recipes' dataset is 50,000 samples, their evaluation set 200).
    inputs = {"dataset_index": args.dataset / "dataset.json", "splits": args.dataset / "splits.json"}
    with StageRun("eval_set", args.manifest, inputs=inputs, params=sections, upstream=args.upstream) as stage:
        chosen = dataset_samples(args.dataset, m.split, m.samples_per_task)
        checked = {}
        for sample in chosen:
            checked[sample.directory] = tree_entries(sample.directory)
            stage.input(f"sample {sample.task}/{sample.sample_id}", sample.directory, checked[sample.directory])
        with atomic.atomic_directory(args.out_tree) as tree:
            placed = write_dataset_tree(tree, chosen)
            samples = eval_samples(tree, len(chosen))  # the exact-set check of any evaluation tree
            entries = tree_entries(tree)
        with atomic.atomic_directory(args.final_frames) as frames:
            for name, sample in placed.items():
                (frames / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(sample.directory / DATASET_FINAL_FRAME, frames / f"{name}.png")
                copied = {leaf: entries[f"{name}/{leaf}"] for leaf in DATASET_FILES}
                copied[DATASET_FINAL_FRAME] = (sha256_file(frames / f"{name}.png"), 0)
                _same_as_checked(sample, checked[sample.directory], copied)
        stage.output("tree", args.out_tree, known=entries, complete=True)
        _write_list(args, stage, args.out_tree, samples, entries)
        per_task = "all" if m.samples_per_task is None else f"the first {m.samples_per_task}"
        where = f"matrix.split {m.split!r} of {args.dataset}, {per_task} of each task"
        stage.summary = _summary(samples, tree_digest_of_entries(entries), where)
    print(f"evaluation set: {len(samples)} samples of the {m.split!r} split, in {args.out_tree}")
    return 0


def _same_as_checked(sample, checked: dict, copied: dict) -> None:
    """What was copied of a sample is what was checked against materialize_dataset's manifest: a file changed in
    between is refused, naming it."""
    for leaf, (sha256, _) in copied.items():
        relative = DATASET_FILES.get(leaf, leaf)
        if checked.get(relative, (None,))[0] != sha256:
            raise DigestMismatch(
                f"{sample.directory / relative}: changed while eval_set copied it (SHA-256 "
                f"{checked.get(relative, ('missing',))[0]} when checked, {sha256} copied); rerun eval_set "
                f"(snakemake --forcerun eval_set), or materialize_dataset if the dataset was edited"
            )


def _write_list(args: argparse.Namespace, stage: StageRun, tree: Path, samples, entries: dict) -> None:
    """samples.json: the tree, and every sample with the SHA-256 of its files (what the cells re-check)."""
    listed = [
        {**s.to_dict(), "name": s.name, "files": {f: entries[f"{s.name}/{f}"][0] for f in SAMPLE_FILES}}
        for s in samples
    ]
    atomic.write_json(args.samples, {"tree": str(tree.resolve()), "samples": listed})
    stage.output("samples", args.samples)
    stage.output("final_frames", args.final_frames)


def _summary(samples, tree_sha256: str, source: str) -> dict:
    domains = sorted({s.domain for s in samples})
    return {
        "source": source,
        "samples": len(samples),
        "tasks": len({s.task for s in samples}),
        "per_domain": {d: sum(s.domain == d for s in samples) for d in domains},
        "tree_sha256": tree_sha256,
    }
