"""generate_cell: the videos of one (model, sampler) cell of the evaluation matrix, exact set validated.

Videos accumulate in <work>/<key>/ (outside the declared output, which Snakemake deletes before a rerun),
keyed by the stage's config and its input digests: an interrupted cell resumes with the videos it lacks,
and videos made by other weights or settings are never reused. The output directory appears only once
the set is exact (one valid video per sample, nothing else). The prompt and first frame of every sample are
checked against samples.json before and after generation: a sample edited meanwhile loses its video.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from videogrpo.errors import VideoGRPOError
from videogrpo.evaluation.evalset import load_samples, recheck_samples
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config, resume_key

# What generation reads of a sample, checked against samples.json before and after it runs.
READ_FILES = ("first_frame.png", "prompt.txt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--model", required=True, type=Path, help="Diffusers pipeline directory")
    parser.add_argument(
        "--transformer",
        type=Path,
        help="transformer replacing the pipeline's (a trained one; I2V: the high-noise expert)",
    )
    parser.add_argument(
        "--transformer-2", type=Path, help="I2V-A14B: low-noise expert replacing the pipeline's transformer_2"
    )
    parser.add_argument(
        "--refiner",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a prompt refiner that rewrites each prompt first, in the refiners section's order (repeat)",
    )
    parser.add_argument("--refiners-json", help="the refiners section (their sampling settings), with --refiner")
    parser.add_argument("--samples", required=True, type=Path, help="the evaluation list (eval_set's samples.json)")
    parser.add_argument("--sampler", required=True, help="unipc, euler or flowcps-<noise>")
    parser.add_argument("--videos", required=True, type=Path, help="directory of the cell's videos to create")
    parser.add_argument("--work", required=True, type=Path, help="where videos accumulate for a resume")


def run(args: argparse.Namespace) -> int:
    from videogrpo.evaluation.generate import Settings, cell_refiners, generate_cell, output_problems
    from videogrpo.progress import Progress

    cfg, sections = load_config(args)
    refiners = cell_refiners(args.refiner, args.refiners_json)
    # Each substituted folder is an input: its digest is checked against train's manifest before it is read.
    inputs = {
        "model": args.model,
        "transformer": args.transformer,
        "transformer_2": args.transformer_2,
        "samples": args.samples,
        **{f"refiner.{name}": folder for name, (folder, _) in refiners.items()},
    }
    with StageRun("generate_cell", args.manifest, inputs=inputs, params=sections, upstream=args.upstream) as stage:
        tree, samples = load_samples(args.samples, check=READ_FILES)
        work = args.work / resume_key("generate_cell", sections, stage, sampler=args.sampler)
        progress = Progress(
            f"generate {args.videos.parent.parent.name}/{args.sampler}", total=len(samples), unit="videos"
        )
        generate_cell(
            cfg,
            args.model,
            args.transformer,
            tree,
            samples,
            args.sampler,
            work / "videos",
            progress,
            transformer_2_dir=args.transformer_2,
            refiners=refiners,
        )
        progress.finish()
        recheck_samples(args.samples, READ_FILES, lambda name: [work / "videos" / f"{name}.mp4"])
        for temporary in (work / "videos").rglob(".*"):  # of an interrupted attempt
            if temporary.is_file():
                temporary.unlink()
        problems = output_problems(work / "videos", samples, Settings.from_config(cfg), rewrites=bool(refiners))
        if problems:
            shown = "\n  - ".join(problems[:20])
            raise VideoGRPOError(
                f"{work / 'videos'}: the cell's videos are not the exact set of {args.samples} "
                f"({len(problems)} problems):\n  - {shown}"
            )
        args.videos.parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / "videos", args.videos)
        for stale in args.work.iterdir():  # work of other weights or settings: never resumed
            shutil.rmtree(stale, ignore_errors=True)
        stage.output("videos", args.videos)
        stage.summary = {"sampler": args.sampler, "videos": len(samples)}
        if refiners:  # each sample's rewrites, in videos/rewrites/
            stage.summary["refiners"] = list(refiners)
    print(f"{args.videos}: {len(samples)} videos")
    return 0
