"""score_cell: one cell's videos prepared and scored by the pinned EvalKit; aggregates per task and domain.

Records of scored samples are kept in <work>/<key>/ (outside the declared outputs), keyed by the stage's
config and input digests: an interrupted scoring resumes, and a failed one keeps every sample's error. The
score files appear only when every sample of the exact set has a score and no record holds an error. The
evaluation tree's files are checked against samples.json before scoring and again after it: a sample edited
while the stage ran loses its record and the stage fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from videogrpo import atomic
from videogrpo.evaluation.aggregate import summarize
from videogrpo.evaluation.evalset import SAMPLE_FILES, load_samples, recheck_samples
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config, resume_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--videos", required=True, type=Path, help="the cell's videos (generate_cell)")
    parser.add_argument("--samples", required=True, type=Path, help="the evaluation list (eval_set's samples.json)")
    parser.add_argument("--final-frames", required=True, type=Path, help="ground-truth final frames (eval_set)")
    parser.add_argument(
        "--evalkit",
        type=Path,
        help="EvalKit checkout (default: evalkit.path; the workflow gives none, so a moved copy is no param)",
    )
    parser.add_argument("--scores", required=True, type=Path, help="per-sample scores (CSV) to create")
    parser.add_argument("--aggregate", required=True, type=Path, help="per task, domain and overall (CSV) to create")
    parser.add_argument("--prepared", required=True, type=Path, help="directory of the scorer's videos to create")
    parser.add_argument("--work", required=True, type=Path, help="where records accumulate for a resume")


def run(args: argparse.Namespace) -> int:
    from videogrpo.evaluation.score import ScoringFailed, sample_work, score_cell

    cfg, sections = load_config(args)
    evalkit = args.evalkit or Path(cfg.evalkit.path)
    inputs = {
        "videos": args.videos,
        "samples": args.samples,
        "final_frames": args.final_frames,
        "evalkit": evalkit,  # where it lives now (execution); evalkit.digest pins what it is
    }
    external = ("evalkit",)  # pinned by evalkit.digest, which fingerprint_evalkit checks
    with StageRun(
        "score_cell", args.manifest, inputs=inputs, params=sections, upstream=args.upstream, external=external
    ) as stage:
        # Every file of a sample reaches the EvalKit (gt_info names the first frame too).
        tree, samples = load_samples(args.samples, check=SAMPLE_FILES)
        work = args.work / resume_key("score_cell", sections, stage)
        scores, errors = score_cell(cfg, evalkit, tree, args.final_frames, samples, args.videos, work)
        recheck_samples(args.samples, SAMPLE_FILES, lambda name: list(sample_work(work, name)))
        if errors:
            shown = "\n  - ".join(f"{r['name']}: {r['error']}" for r in errors[:20])
            raise ScoringFailed(
                f"{args.videos}: {len(errors)} of {len(samples)} samples have scorer errors, so no score file is "
                f"written (every record is kept in {work / 'records'}):\n  - {shown}"
            )
        if len(scores) != len(samples) or scores["name"].duplicated().any():
            raise ScoringFailed(f"{args.videos}: {len(scores)} scores for {len(samples)} samples")
        table = summarize(scores, cfg.matrix.bootstrap, cfg.matrix.seed)
        with atomic.atomic_path(args.scores) as tmp:
            scores.to_csv(tmp, index=False)
        with atomic.atomic_path(args.aggregate) as tmp:
            table.to_csv(tmp, index=False)
        os.replace(work / "prepared", args.prepared)
        for stale in args.work.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        for name, path in (("scores", args.scores), ("aggregate", args.aggregate), ("prepared", args.prepared)):
            stage.output(name, path)
        overall = table[table.level == "overall"].iloc[0]
        stage.summary = {"samples": len(scores), "overall": float(overall["mean"])}
        print(table.to_string(index=False))
    return 0
