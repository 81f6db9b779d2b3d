"""report: every manifest merged into provenance.json, and an HTML page with the reward curve, the held-out check
and the evaluation matrix (both files also logged to the run's MLflow run where logging.tracker lists mlflow).

The held-out check is two of the matrix's cells, the trained and the base model under the training sampler
(config/cells.py): the page shows their rows of the matrix's per-task table and their videos of the same samples,
as the scorer saw them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

from videogrpo import atomic
from videogrpo.config import check_models, training_sampler
from videogrpo.grpo.mlflow_run import log_stage_outputs
from videogrpo.provenance import refiner_page
from videogrpo.provenance.crate import write_run_crate
from videogrpo.provenance.manifest import StageRun
from videogrpo.provenance.report_page import build_provenance, render_html
from videogrpo.stages.common import add_config_argument, add_model_arguments, load_config, model_inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--run-id", required=True)
    parser.add_argument(
        "--stage-manifest",
        action="append",
        default=[],
        metavar="STAGE=PATH",
        help="a stage's manifest (repeat for every stage)",
    )
    parser.add_argument("--metrics", required=True, type=Path, help="training metrics (JSON lines)")
    parser.add_argument("--per-task", required=True, type=Path, help="the matrix's per-task table (CSV)")
    parser.add_argument("--matrix", required=True, type=Path, help="the evaluation matrix (CSV)")
    parser.add_argument("--provenance", required=True, type=Path, help="provenance.json to create")
    parser.add_argument("--html", required=True, type=Path, help="report.html to create")
    parser.add_argument("--crate", required=True, type=Path, help="the run's ro-crate-metadata.json (run dir root)")
    parser.add_argument("--invocation", type=Path, help="the config files and --config overrides as given (JSON)")
    add_model_arguments(parser)


def check_videos(provenance: dict, models: tuple[str, ...], sampler: str, html: Path) -> dict[str, list[str]]:
    """The held-out check's videos by model (`base`, `trained`) as the EvalKit scored them (each cell's score_cell
    output `prepared/<domain>/<task>/<index>.mp4`), as paths relative to the report page."""
    found: dict[str, list[str]] = {}
    for model in models:
        record = provenance["stages"].get(f"score_cell:{model}:{sampler}", {}).get("outputs", {}).get("prepared")
        if record:
            found[model] = [
                os.path.relpath(Path(record["path"]) / rel, html.parent) for rel in sorted(record.get("entries", {}))
            ]
    return found


def rewrite_samples(provenance: dict, sampler: str, html: Path, limit: int = 6) -> list[dict]:
    """A sample of the `refined` cell's rewrites (prompt refiners) under the held-out check's sampler, each beside
    its video and the trained generator's video of the same sample and noise (paths relative to the page)."""
    generated = provenance["stages"].get(f"generate_cell:refined:{sampler}", {}).get("outputs", {}).get("videos")
    videos = check_videos(provenance, ("trained", "refined"), sampler, html)
    if not generated or not videos.get("refined"):
        return []
    trained = {Path(rel).with_suffix("").parts[-3:]: rel for rel in videos.get("trained", [])}
    found = []
    for rel in videos["refined"][:limit]:
        key = Path(rel).with_suffix("").parts[-3:]  # domain/task/index
        record = json.loads((Path(generated["path"]) / "rewrites" / Path(*key).with_suffix(".json")).read_text())
        fallbacks = [r["fallback"] for r in record["rewrites"] if r["fallback"]]
        found.append(
            {
                "task": key[1],
                "sample": key[2],
                "original": record["original"],
                "rewrite": record["generator_prompt"],
                "fallback": ", ".join(fallbacks),
                "refined": rel,
                "trained": trained.get(key, ""),
            }
        )
    return found


def posters(videos: dict[str, list[str]], html: Path, side: int = 256) -> dict[str, str]:
    """For each video the page shows (report_page.video_pairs picks them), its last frame (what the EvalKit
    scores; the first is the condition, the same for base and trained) as a small JPEG data URL."""
    import base64
    import io

    from PIL import Image

    from videogrpo.data.video import last_frame
    from videogrpo.provenance.report_page import video_pairs

    found = {}
    for _, _, *shown in video_pairs(videos)[0]:
        for rel in shown:
            image = Image.fromarray(last_frame(html.parent / rel))
            image.thumbnail((side, side))
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=80)
            found[rel] = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    return found


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    manifests = dict(item.split("=", 1) for item in args.stage_manifest)
    manifests = {name: Path(path) for name, path in manifests.items()}
    sampler, models = training_sampler(cfg), check_models(cfg)
    # Every stage's manifest is upstream: the metrics and the tables must be what train and matrix made, and the
    # models the page describes (the trained weights among them) what their stages made and the matrix evaluated.
    inputs = dict(manifests, metrics=args.metrics, per_task=args.per_task, matrix=args.matrix, **model_inputs(args))
    with StageRun(
        "report",
        args.manifest,
        inputs=inputs,
        params=sections,
        upstream=[*manifests.values(), *args.upstream],
        digest_cache=args.digest_cache,
    ) as stage:
        provenance = build_provenance(
            manifests, args.run_id, json.loads(args.invocation.read_text()) if args.invocation else {}
        )
        metrics = [json.loads(line) for line in args.metrics.read_text().splitlines() if line]
        check = [row for row in read_csv(args.per_task) if row["sampler"] == sampler and row["model"] in models]
        videos = check_videos(provenance, models, sampler, args.html)
        atomic.write_json(args.provenance, provenance)
        matrix = read_csv(args.matrix)
        refiners = refiner_page.section(metrics, matrix, rewrite_samples(provenance, sampler, args.html))
        page = render_html(provenance, metrics, check, videos, matrix, sampler, posters(videos, args.html), refiners)
        atomic.write_text(args.html, page)
        stage.output("provenance", args.provenance)
        stage.output("html", args.html)
        stage.output("crate", write_run_crate(args.crate.parent, provenance))
        log_stage_outputs(cfg.logging, args.run_id, "report", [args.html, args.provenance])
    print(f"report: {args.html.resolve()}")
    return 0
