"""What every stage command shares: its config sections from --config-json, and its manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from videogrpo import config as config_mod
from videogrpo.config import Config, canonical_json
from videogrpo.provenance.manifest import MODEL_INPUT


def add_config_argument(parser: argparse.ArgumentParser, manifest_required: bool = True) -> None:
    parser.add_argument(
        "--config-json",
        required=True,
        help="the config sections this stage reads, as JSON or @file (the Snakemake rule passes a file)",
    )
    parser.add_argument("--manifest", required=manifest_required, type=Path, help="where to write the stage manifest")
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        type=Path,
        metavar="MANIFEST",
        help="manifest of a stage whose outputs this one reads: inputs are checked against it",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """A stage that presents or evaluates models (matrix, report): the models' files it names, each checked against
    the manifest of the stage that made it (given with --upstream) before it starts, through the digest cache."""
    parser.add_argument(
        "--model-files",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="the files of a model the stage names (repeat): checked against its stage's manifest",
    )
    parser.add_argument(
        "--digest-cache", type=Path, help="digests trusted by their stamps (results/.checked-digests.json)"
    )


def model_inputs(args: argparse.Namespace) -> dict[str, Path]:
    """StageRun inputs of --model-files: `model:<name>` -> its path."""
    return {f"{MODEL_INPUT}{name}": Path(path) for name, _, path in (item.partition("=") for item in args.model_files)}


def load_config(args: argparse.Namespace) -> tuple[Config, dict]:
    """The stage's Config (other sections at their defaults, unvalidated) and the sections as given."""
    sections = config_mod.sections_from_argument(args.config_json)
    return config_mod.from_dict(sections, partial=True), sections


def resume_key(stage: str, sections: dict, stage_run, **extra) -> str:
    """Name of the folder where a stage keeps work for a resume: a digest of the config it reads (execution and
    cosmetic fields left out: work made with other workers or ports is the same work), the digests of its
    inputs and the package code it runs (the rule's code param, provenance/code.py), so work made under other
    settings, inputs or code is never reused: after an edit of the sampler or the reward, nothing stale returns."""
    from videogrpo.provenance.code import stage_code
    from videogrpo.provenance.digest import sha256_bytes
    from videogrpo.provenance.manifest import record_digest

    key = {
        "config": config_mod.identity_fields(sections),
        # An execution field, but the OCR weights score too: kept scores of other weights are not these.
        "easyocr_models": sections.get("evalkit", {}).get("easyocr_models"),
        "inputs": {k: record_digest(v) for k, v in stage_run.input_records.items()},
        "code": stage_code(stage),
        **extra,
    }
    return sha256_bytes(canonical_json(key).encode())[:12]
