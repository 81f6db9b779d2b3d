"""Typed configuration: sections, precedence, validation, run identity.

Precedence: dataclass defaults < config/config.yaml < recipe (--configfile) < --config overrides.
Snakemake merges the YAML layers; `from_dict` fills defaults, coerces the strings that `--config`
produces, and checks every field and every cross-field rule, naming the field, the value and the
rule. The dataclass defaults are the values shared by all released recipes (REFERENCE section 6).

This module must stay light: the Snakefile imports it at parse time (no torch, no diffusers).
"""

from videogrpo.config.checks import (CHOICES, HEX40, HEX64, NON_NEGATIVE, POSITIVE, problems, runtime_contract,
                                     topology_problems, validate)
from videogrpo.config.identity import (RUN_SECTIONS, STAGE_SECTIONS, TRAINING_CONTRACT, canonical_json,
                                       read_task_list, run_identity, stage_view, task_names, to_dict,
                                       training_contract)
from videogrpo.config.load import deep_merge, from_dict, json_schema, load
from videogrpo.config.sections import (SECTIONS, Config, DataConfig, EvalKitConfig, EvaluateConfig, GRPOConfig,
                                       LoggingConfig, ModelConfig, ParallelConfig, RewardConfig, SlurmConfig,
                                       TrainConfig, VideoConfig)

__all__ = [
    'CHOICES', 'Config', 'DataConfig', 'EvalKitConfig', 'EvaluateConfig', 'GRPOConfig', 'HEX40', 'HEX64',
    'LoggingConfig', 'ModelConfig', 'NON_NEGATIVE', 'POSITIVE', 'ParallelConfig', 'RUN_SECTIONS',
    'RewardConfig', 'SECTIONS', 'STAGE_SECTIONS', 'SlurmConfig', 'TRAINING_CONTRACT', 'TrainConfig',
    'VideoConfig', 'canonical_json', 'deep_merge', 'from_dict', 'json_schema', 'load', 'problems',
    'read_task_list', 'run_identity', 'runtime_contract', 'stage_view', 'task_names', 'to_dict',
    'topology_problems', 'training_contract', 'validate',
]
