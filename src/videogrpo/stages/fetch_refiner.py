"""fetch_refiner: one prompt refiner's download (a refiners.experts record), pinned (hub) or built (tiny), and its
manifest. The rule runs once per distinct download (pipeline/layout.py's refiner_key): two refiners that start from
one model share it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from videogrpo import atomic
from videogrpo.artifacts import hub
from videogrpo.errors import ConfigError
from videogrpo.provenance.manifest import StageRun


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--download-json",
        required=True,
        help='what to fetch: {"source": "hub", "repo_id": ..., "revision": ...} or {"source": "tiny", "tiny_seed": N, '
        '"vision": false}',
    )
    parser.add_argument("--out", required=True, type=Path, help="refiner directory to create")
    parser.add_argument("--manifest", required=True, type=Path, help="where to write the stage manifest")
    parser.add_argument("--upstream", action="append", default=[], type=Path, help=argparse.SUPPRESS)


def read_download(text: str) -> dict:
    try:
        download = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--download-json: not valid JSON ({err})") from None
    wanted = {"tiny": {"source", "tiny_seed", "vision"}, "hub": {"source", "repo_id", "revision"}}
    if not isinstance(download, dict) or set(download) != wanted.get(download.get("source"), set()):
        raise ConfigError(
            f"--download-json {text}: expected the keys {sorted(wanted['hub'])} (source hub) or "
            f"{sorted(wanted['tiny'])} (source tiny)"
        )
    return download


def run(args: argparse.Namespace) -> int:
    download = read_download(args.download_json)
    known = None  # (sha256, size) per file where the download already hashed it
    with StageRun("fetch_refiner", args.manifest, inputs={}, params=download, upstream=args.upstream) as stage:
        if download["source"] == "tiny":
            from videogrpo.demo.tiny_refiner import save_tiny_refiner

            with atomic.atomic_directory(args.out) as tmp:
                save_tiny_refiner(tmp, download["tiny_seed"], vision=download["vision"])
        else:
            known = hub.snapshot(download["repo_id"], download["revision"], args.out, repo_type="model")
        stage.summary = dict(download)
        stage.output("refiner", args.out, known=known)
    print(f"refiner ready: {args.out}")
    return 0
