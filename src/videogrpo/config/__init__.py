"""Typed configuration: sections, precedence, validation, run identity.

Precedence: dataclass defaults < config/config.yaml < recipe (--configfile) < --config overrides.
Snakemake merges the YAML layers; `from_dict` fills defaults, coerces the strings that `--config`
produces, and checks every field and every cross-field rule, naming the field, the value and the
rule. The dataclass defaults are the values shared by all released recipes (docs/reference-system.md#recipes).

This package must stay light: the Snakefile imports it at parse time (no torch, no diffusers). May import only the
core modules (`errors`).
"""

from videogrpo.config.cells import RUN_MODELS, check_models, matrix_cells, training_sampler
from videogrpo.config.checks import problems, topology_problems, uses_hub_kernel, uses_tracker, validate
from videogrpo.config.fields import (
    CHOICES,
    HEX40,
    HEX64,
    NON_NEGATIVE,
    POSITIVE,
    kinds_in,
    revision_problem,
    reward_kinds,
    runtime_contract,
    training_reward_kinds,
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
    flat_fields,
    identity_fields,
    options_on,
    read_task_list,
    read_task_list_text,
    run_identity,
    select,
    stage_view,
    task_names,
    to_dict,
    training_contract,
)
from videogrpo.config.load import deep_merge, from_dict, json_schema, load, refiner_paths, sections_from_argument
from videogrpo.config.option_rules import setting_warnings
from videogrpo.config.sections import (
    SECTIONS,
    Config,
    DataConfig,
    EvalKitConfig,
    GRPOConfig,
    LoggingConfig,
    ModelConfig,
    ParallelConfig,
    RewardConfig,
    TrainConfig,
    VideoConfig,
)

__all__ = [
    "refiner_paths",
    "RUN_MODELS",
    "setting_warnings",
    "CONTRACT",
    "COSMETIC",
    "EVALUATION",
    "EXECUTION",
    "field_class",
    "field_paths",
    "fields_of_class",
    "flat_fields",
    "identity_fields",
    "options_on",
    "sections_from_argument",
    "select",
    "CHOICES",
    "Config",
    "DataConfig",
    "EvalKitConfig",
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
    "TrainConfig",
    "VideoConfig",
    "canonical_json",
    "check_models",
    "deep_merge",
    "from_dict",
    "json_schema",
    "load",
    "matrix_cells",
    "problems",
    "revision_problem",
    "read_task_list",
    "read_task_list_text",
    "run_identity",
    "runtime_contract",
    "stage_view",
    "task_names",
    "to_dict",
    "topology_problems",
    "uses_hub_kernel",
    "kinds_in",
    "reward_kinds",
    "training_reward_kinds",
    "uses_tracker",
    "training_contract",
    "training_sampler",
    "validate",
]
