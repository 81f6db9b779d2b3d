"""Typed configuration: sections, precedence, validation, run identity.

Precedence: dataclass defaults < config/config.yaml < recipe (--configfile) < --config overrides.
Snakemake merges the YAML layers; `from_dict` fills defaults, coerces the strings that `--config`
produces, and checks every field and every cross-field rule, naming the field, the value and the
rule. The dataclass defaults are the values shared by all released recipes (REFERENCE section 6).

This module must stay light: the Snakefile imports it at parse time (no torch, no diffusers).
"""

from videogrpo.config.checks import (
    CHOICES,
    HEX40,
    HEX64,
    NON_NEGATIVE,
    POSITIVE,
    problems,
    runtime_contract,
    topology_problems,
    validate,
)
from videogrpo.config.identity import (
    CONTRACT,
    COSMETIC,
    EVALUATION,
    EXECUTION,
    RUN_SECTIONS,
    STAGE_SECTIONS,
    canonical_json,
    field_class,
    field_paths,
    fields_of_class,
    read_task_list,
    read_task_list_text,
    run_identity,
    select,
    stage_view,
    task_names,
    to_dict,
    training_contract,
)
from videogrpo.config.load import deep_merge, from_dict, json_schema, load
from videogrpo.config.sections import (
    SECTIONS,
    Config,
    DataConfig,
    EvalKitConfig,
    EvaluateConfig,
    GRPOConfig,
    LoggingConfig,
    ModelConfig,
    ParallelConfig,
    RewardConfig,
    SlurmConfig,
    TrainConfig,
    VideoConfig,
)

__all__ = [
    "CONTRACT",
    "COSMETIC",
    "EVALUATION",
    "EXECUTION",
    "field_class",
    "field_paths",
    "fields_of_class",
    "select",
    "CHOICES",
    "Config",
    "DataConfig",
    "EvalKitConfig",
    "EvaluateConfig",
    "GRPOConfig",
    "HEX40",
    "HEX64",
    "LoggingConfig",
    "ModelConfig",
    "NON_NEGATIVE",
    "POSITIVE",
    "ParallelConfig",
    "RUN_SECTIONS",
    "RewardConfig",
    "SECTIONS",
    "STAGE_SECTIONS",
    "SlurmConfig",
    "TrainConfig",
    "VideoConfig",
    "canonical_json",
    "deep_merge",
    "from_dict",
    "json_schema",
    "load",
    "problems",
    "read_task_list",
    "read_task_list_text",
    "run_identity",
    "runtime_contract",
    "stage_view",
    "task_names",
    "to_dict",
    "topology_problems",
    "training_contract",
    "validate",
]
