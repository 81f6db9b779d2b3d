"""Precedence and coercion: YAML layers and overrides merged the way Snakemake does, then validated."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from videogrpo.config.checks import validate
from videogrpo.config.fields import CHOICES
from videogrpo.config.retired import retired_in_layers, retired_problems
from videogrpo.config.sections import Config
from videogrpo.config.types import build
from videogrpo.config.types import json_schema as _schema_of
from videogrpo.errors import ConfigError


def from_dict(data: dict[str, Any], partial: bool = False) -> Config:
    """Fill defaults, coerce, and validate a merged config mapping.

    With `partial`, only the sections present are validated: a stage receives just the sections it
    reads, so that changing another section does not rerun it.
    """
    if retired := retired_problems(data):
        raise ConfigError("fields that are gone:\n  - " + "\n  - ".join(retired))
    cfg = build(Config, copy.deepcopy(data), "")
    validate(cfg, set(data) if partial else None)
    return cfg


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Merge like Snakemake does for configfiles and --config: mappings recursively, the rest replaced."""
    merged = copy.deepcopy(base)
    for key, value in (update or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load(configfiles: list[str | Path], overrides: dict[str, Any] | None = None) -> Config:
    """Resolve YAML layers and overrides the way `snakemake --configfile ... --config ...` does."""
    import yaml

    if retired := retired_in_layers(configfiles, overrides):
        raise ConfigError("fields that are gone:\n  - " + "\n  - ".join(retired))
    merged: dict[str, Any] = {}
    for path in configfiles:
        try:
            layer = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        merged = deep_merge(merged, layer)
    return from_dict(deep_merge(merged, overrides or {}))


def json_schema() -> dict[str, Any]:
    """JSON Schema of the config, generated from the dataclasses (defaults and descriptions included)."""
    return _schema_of(Config, CHOICES)


def sections_from_argument(value: str) -> dict[str, Any]:
    """The config sections a command receives: JSON, or `@file` holding it (what the workflow passes)."""
    import json

    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except FileNotFoundError:
            raise ConfigError(f"--config-json {value}: no such file") from None
    try:
        sections = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--config-json: not valid JSON ({err})") from None
    if not isinstance(sections, dict):
        raise ConfigError("--config-json: expected a JSON object of config sections")
    return sections


def refiner_paths(given: list[str]) -> dict[str, Path]:
    """`--refiner NAME=DIR` arguments (the train stage's and its workers') as {name: directory}."""
    found = {}
    for item in given:
        name, sep, where = item.partition("=")
        if not sep or not name or not where:
            raise ConfigError(f"--refiner {item!r}: expected NAME=DIR (a prompt refiner's name and its download)")
        found[name] = Path(where)
    return found
