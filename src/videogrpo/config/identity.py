"""Run identity and stage views: which config fields define a run, and which sections each stage reads."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from videogrpo.config.sections import Config
from videogrpo.errors import ConfigError

# What defines a training run: changing any of it must give a new run directory (DESIGN: run identity).
TRAINING_CONTRACT = {
    "model": None, "data": None, "video": None, "reward": None, "grpo": None, "parallel": None,
    "evalkit": ("digest", "unsupported_score", "video_size", "max_seconds", "crf", "runtime"),
    "train": ("lr", "warmup_steps", "weight_decay", "max_grad_norm", "epochs", "max_steps", "batch_size",
              "save_steps", "seed", "resume_from", "reset_dataloader", "gradient_checkpointing"),
}


# The sections each stage reads. They are the stage's Snakemake params, so changing one reruns it.
RUN_SECTIONS = ("recipe", "model", "data", "video", "evalkit", "reward", "grpo", "train", "parallel")
STAGE_SECTIONS = {
    "fetch_model": ("model",),
    "fetch_dataset": ("data",),
    "materialize_dataset": ("data",),
    "validate_dataset": ("data",),
    "fingerprint_evalkit": ("evalkit",),
    "check_scorer_runtime": ("evalkit",),
    "preflight": RUN_SECTIONS,
    "train": RUN_SECTIONS + ("logging",),
    "evaluate": RUN_SECTIONS + ("evaluate",),
    "report": ("recipe",),
}


def stage_view(cfg: Config, stage: str) -> dict[str, Any]:
    full = to_dict(cfg)
    return {section: full[section] for section in STAGE_SECTIONS[stage]}


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def training_contract(cfg: Config, task_list_text: str) -> dict[str, Any]:
    full = to_dict(cfg)
    contract = {}
    for section, keys in TRAINING_CONTRACT.items():
        values = full[section]
        contract[section] = values if keys is None else {k: values[k] for k in keys}
    contract["data"] = dict(contract["data"], task_list=sorted(task_names(task_list_text)))
    return contract


def task_names(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_task_list(path: str | Path) -> list[str]:
    try:
        return task_names(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"data.task_list = {str(path)!r}: file not found") from None


def run_identity(cfg: Config, task_list_text: str | None = None) -> str:
    """`<recipe>-<12 hex>`: the hex digests the canonical training contract."""
    if task_list_text is None:
        task_list_text = Path(cfg.data.task_list).read_text()
    digest = hashlib.sha256(canonical_json(training_contract(cfg, task_list_text)).encode()).hexdigest()
    return f"{cfg.recipe}-{digest[:12]}"


