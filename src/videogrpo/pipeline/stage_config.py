"""What each stage's rule hands its command: the config fields it reads, as params and as a file.

A stage reads a view of the config (`config.stage_view`). Its contract and evaluation fields are params of its
rule, one each, so that a change reruns the stage and `snakemake -n` names the field
(`before: 'train.lr=0.0001' now: 'train.lr=0.0002'`). Its execution and cosmetic fields (how it runs, labels) are
no param: a change reruns nothing complete, and the stage's next run applies it.

The command receives the whole view in a file (`--config-json @<file>`) whose name is a digest of the params, so
that a changed param names another file. The files are written when a run starts (the workflow's `onstart`),
never while the workflow is read: a dry run changes nothing on disk, and a job that a scheduler retries reads the
file its run wrote. An execution field changed since the file was last written is said then, with how to apply it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from videogrpo import atomic
from videogrpo.config import Config, canonical_json, flat_fields, identity_fields, stage_view
from videogrpo.provenance.code import stage_code
from videogrpo.provenance.digest import sha256_bytes

CONFIG_DIR = ".stage-config"
WITHOUT_CONFIG_FILE = ("fetch_refiner",)
"""Stages whose rule hands the command what it reads as one param (a refiner's download: one rule, one job per
download), not as a config file."""


def param_texts(cfg: Config, stage: str) -> dict[str, str]:
    """The contract and evaluation fields a stage reads, as {`section__field`: `section.field=<json>`}."""
    return {
        path.replace(".", "__"): f"{path}={json.dumps(value, sort_keys=True)}"
        for path, value in identity_fields(stage_view(cfg, stage)).items()
    }


def rule_params(cfg: Config, stage: str) -> dict[str, Any]:
    """param_texts as Snakemake params. Snakemake expands {wildcards} in params strings, so a value holding braces
    (a command template) is given as a function, whose value is taken as it is."""
    texts = param_texts(cfg, stage)
    return {key: (lambda wildcards, text=text: text) if "{" in text else text for key, text in texts.items()}


def config_path(results: str | Path, cfg: Config, stage: str) -> Path:
    """The stage's config file: named by a digest of its params, so that changing one names another file."""
    name = sha256_bytes(canonical_json(param_texts(cfg, stage)).encode())[:16]
    return Path(results) / CONFIG_DIR / f"{stage}-{name}.json"


def config_text(cfg: Config, stage: str) -> str:
    return canonical_json(stage_view(cfg, stage))


def code_param(cfg: Config, stage: str) -> str:
    """A rule's `code` param: the code identity of what the stage runs (provenance/code.py). A download of a
    pinned Hub snapshot runs no code that shapes its bytes (the revision fixes them), so editing the package never
    downloads again; a generated input (the tiny model, the synthetic dataset) is its generator's code."""
    if stage in ("fetch_judge", "fetch_kernel", "fetch_eval_model"):
        return "pinned Hub snapshot"
    if stage == "fetch_model" and cfg.model.source != "tiny":
        return "pinned Hub snapshot"
    if stage == "fetch_dataset" and cfg.data.source != "synthetic":
        return "pinned Hub snapshot"
    return stage_code(stage)


def unapplied_fields(stage: str, before_text: str, now_text: str) -> str | None:
    """The note for a stage whose config file changes in place (execution fields or labels): which fields, from
    what to what, and how to apply them; None when nothing comparable changed."""
    try:
        before = flat_fields(json.loads(before_text))
    except (ValueError, AttributeError):  # a file cut short: nothing to compare with
        return None
    now = flat_fields(json.loads(now_text))
    changed = [
        f"{path} {json.dumps(before.get(path))} -> {json.dumps(value)}"
        for path, value in now.items()
        if before.get(path) != value
    ]
    if not changed:
        return None
    return (
        f"note: {stage}: {'; '.join(changed)}: how it runs, not what it makes: nothing complete reruns, the "
        f"stage's next run applies it (`--forcerun {stage}` reruns it and what follows it)"
    )


def write_config_files(results: str | Path, cfg: Config, stages: list[str]) -> list[str]:
    """Write each stage's config file where it differs (atomically); returns the notes on changed fields."""
    notes = []
    for stage in (s for s in stages if s not in WITHOUT_CONFIG_FILE):
        path, text = config_path(results, cfg, stage), config_text(cfg, stage)
        before = path.read_text() if path.is_file() else None
        if before == text:
            continue
        if before is not None and (note := unapplied_fields(stage, before, text)):
            notes.append(note)
        atomic.write_text(path, text)
    return notes
