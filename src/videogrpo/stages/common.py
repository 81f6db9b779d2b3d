"""What every stage command shares: its config sections from --config-json, and its manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import config as config_mod
from videogrpo.config import Config


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config-json",
        required=True,
        help="the config sections this stage reads, as JSON or @file (the Snakemake rule passes a file)",
    )
    parser.add_argument("--manifest", required=True, type=Path, help="where to write the stage manifest")
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        type=Path,
        metavar="MANIFEST",
        help="manifest of a stage whose outputs this one reads: inputs are checked against it",
    )


def load_config(args: argparse.Namespace) -> tuple[Config, dict]:
    """The stage's Config (other sections at their defaults, unvalidated) and the sections as given."""
    sections = config_mod.sections_from_argument(args.config_json)
    return config_mod.from_dict(sections, partial=True), sections
