"""What every stage command shares: its config sections from --config-json, and its manifest."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from videogrpo import config as config_mod
from videogrpo.config import Config
from videogrpo.errors import ConfigError


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
    text = args.config_json
    if text.startswith("@"):  # the file the workflow wrote (workflow/rules/common.smk: stage_config)
        try:
            text = Path(text[1:]).read_text()
        except FileNotFoundError:
            raise ConfigError(f"--config-json {args.config_json}: no such file") from None
    try:
        sections = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--config-json: not valid JSON ({err})") from None
    if not isinstance(sections, dict):
        raise ConfigError("--config-json: expected a JSON object of config sections")
    return config_mod.from_dict(sections, partial=True), sections
