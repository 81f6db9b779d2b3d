"""Run identity and stage views: what every config field is for, and which fields each stage reads.

Every field belongs to exactly one class (`field_class`; a test checks that none is missing):
- contract: what a training run computes. The run identity digests these fields, so changing one
  gives a new run directory (a new run), never a resume of checkpoints made under other values.
- execution: how and where the work runs (paths, ports, workers, threads, kernels, logging,
  checkpoint retention, resume settings, retries, the Kubernetes Job's volume). No stage's param, as in Nextflow, whose
  resume hash leaves resource directives out: a change reruns no complete stage, and each stage reads
  it from its config file at its next run (an interrupted one included). Paths that locate an input
  key the directories of what is made from it instead (`results`; `evalkit.easyocr_models`, the EvalKit's
  records), or are read as inputs (`matrix.eval_set`: its files, so a moved tree is checked and listed
  again). `evalkit.path` does neither: the checkout is pinned by `evalkit.digest`, so a copy elsewhere is
  the same EvalKit.
- evaluation: what the evaluation measures (the evaluation set, the matrix's cells and their settings). A change
  reruns the evaluation stages that read it and the report only.
- cosmetic: labels that change no computed value (the W&B project, the split name recorded in the
  split manifest). They are passed to the stages that record them but are no stage's param: a
  change reruns nothing and applies the next time such a stage runs.

A field that has no effect under the chosen source (`model.revision` of the tiny generator, the Hub
repository of synthetic data) is read as empty (`INERT_FIELDS`): never a new run, never a rerun.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from videogrpo.config.actors_section import prefetch
from videogrpo.config.sections import Config
from videogrpo.errors import ConfigError

CONTRACT, EXECUTION, EVALUATION, COSMETIC = "contract", "execution", "evaluation", "cosmetic"

# Sections whose fields all share one class, then the fields of the mixed sections.
_SECTION_CLASSES = {
    "model": CONTRACT,
    "video": CONTRACT,
    "grpo": CONTRACT,
    "refiners": CONTRACT,
    "matrix": EVALUATION,
    "kubernetes": EXECUTION,
    "recipe": CONTRACT,
    "results": EXECUTION,
}
_FIELD_CLASSES = {
    # Which ranks train is the topology, as parallel.nodes and procs_per_node are; how long a rank waits for an actor
    # changes nothing computed.
    "actors.stall_timeout_s": EXECUTION,
    **{
        f"actors.{f}": CONTRACT
        for f in ("train_ranks", "train_nodes", "weight_sync", "asynchronous", "prefetch", "sync_interval")
    },
    **{
        f"data.{f}": CONTRACT
        for f in (
            "source",
            "repo_id",
            "revision",
            "archive_glob",
            "task_list",
            "samples_per_task",
            "heldout_per_task",
            "gt_frames",
            "gt_height",
            "gt_width",
            "shuffle_seed",
            "synthetic_seed",
        )
    },
    "data.split_name": COSMETIC,
    **{f"data.{f}": EXECUTION for f in ("verify_existing", "max_member_mb", "inflater")},
    **{
        f"evalkit.{f}": CONTRACT
        for f in ("digest", "unsupported_score", "fail_on_error", "video_size", "max_seconds", "crf", "runtime")
    },
    **{f"evalkit.{f}": EXECUTION for f in ("path", "python", "workers", "threads_per_worker", "easyocr_models")},
    **{
        f"reward.{f}": CONTRACT
        for f in (
            "kind",
            "judge_model",
            "judge_revision",
            "judge_frames",
            "judge_prompts_digest",
            "judge_protocol_digest",
            "judge_fps",
            "judge_served_name",
            "judge_error_score",
            "judge_fail_on_error",
            "judge_max_retries",
            "terms",
        )
    },
    **{
        f"reward.{f}": EXECUTION
        for f in (
            "judge_port",
            "judge_concurrency",
            "judge_prompts",
            "judge_protocol",
            "judge_timeout_s",
            "judge_endpoint",
            "judge_serve_command",
            "judge_python",
            "judge_tensor_parallel",
            "judge_data_parallel",
            "judge_gpu_memory",
            "judge_max_model_len",
            "judge_max_num_seqs",
            "judge_ready_timeout_s",
        )
    },
    **{
        f"train.{f}": CONTRACT
        for f in (
            "lr",
            "warmup_steps",
            "lr_schedule",
            "weight_decay",
            "ema_decay",
            "ema_every",
            "ema_repeats",
            "max_grad_norm",
            "epochs",
            "max_steps",
            "batch_size",
            "experts",
            "save_steps",
            "seed",
            "lora_rank",
            "lora_alpha",
            "lora_dropout",
            "lora_targets",
            "lora_export_merged",
            "lora_base_dtype",
            "validate_every",
            "validate_before_training",
            "validate_prompts",
            "validate_sampler",
            "validate_rewards",
            "validate_rewards_fail_on_error",
            "divergence_points",
            "divergence_sigmas",
            "divergence_min_change",
            "keep_best_by",
            "stop_on_divergence",
        )
    },
    # Activation checkpointing recomputes exactly; resume settings say how this attempt starts.
    **{
        f"train.{f}": EXECUTION
        for f in (
            "keep_checkpoints",
            "resume_past_divergence",
            "auto_resume",
            "resume_from",
            "reset_dataloader",
            "resume_across_code_changes",
            "retries",
            "gradient_checkpointing",
            "offload_inference_models",
        )
    },
    # Where frozen models live, what is cached and how many rows a rollout or decode takes at once: the same
    # numbers (tests/test_offload.py), as with attention backends up to the rounding of other batch shapes.
    **{f: EXECUTION for f in ("model.prompt_cache_bytes", "grpo.sample_batch_size", "grpo.decode_batch_size")},
    **{
        f"parallel.{f}": CONTRACT
        for f in (
            "nodes",
            "procs_per_node",
            "data_parallel",
            "shard_group_size",
            "tensor_parallel",
            "device",
            "param_dtype",
            "reduce_dtype",
        )
    },
    # The attention kernel is how attention runs, as the backend is: its own download, keyed by its revision.
    **{
        f"parallel.{f}": EXECUTION
        for f in (
            "backend",
            "attention_backend",
            "attention_kernel_repo",
            "attention_kernel_revision",
            "compile",
            "master_port",
            "cpu_threads",
            "device_memory_gib",
            # Where the optimizer state and gradients wait between updates: the same update (docs/options.md),
            # so a run that ran out of device memory resumes with them on.
            "offload_optimizer",
            "offload_gradients",
        )
    },
    "logging.wandb_mode": EXECUTION,
    "logging.tracker": EXECUTION,
    # Where the evaluation tree is and how many processes generate: its digest and the settings are the pin.
    **{f"matrix.{f}": EXECUTION for f in ("eval_set", "procs")},
    "logging.wandb_project": COSMETIC,
    "logging.mlflow_experiment": COSMETIC,
}


def field_paths(cfg: Config | None = None) -> list[str]:
    """Every config field as `section.field` (or `field` for top-level scalars), in declaration order."""
    cfg = cfg or Config()
    paths = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        is_section = dataclasses.is_dataclass(value)
        paths += [f"{f.name}.{g.name}" for g in dataclasses.fields(value)] if is_section else [f.name]
    return paths


def field_class(path: str) -> str:
    """The class of a field (`section.field`); a field nobody classified is an error, not a guess."""
    if path in _FIELD_CLASSES:
        return _FIELD_CLASSES[path]
    if path.split(".")[0] in _SECTION_CLASSES:
        return _SECTION_CLASSES[path.split(".")[0]]
    raise KeyError(f"config field {path} has no class in config/identity.py")


def fields_of_class(kind: str) -> list[str]:
    return [path for path in field_paths() if field_class(path) == kind]


# What a generated evaluation video depends on besides the model, the sampler and the generation settings
# (generation_fields): with them they key the matrix's directory, so cells of other settings live beside, never in
# place of, each other.
GENERATION_FIELDS = (
    "model.kind",
    "model.max_text_tokens",
    "model.frozen_dtype",
    "model.condition_dtype",
    "parallel.param_dtype",
    "grpo.trajectory_dtype",
)


SHAPE = ("num_frames", "height", "width")


def generation_fields(cfg: Config) -> dict[str, str]:
    """Where each setting of a matrix cell's generation lives, {setting: `section.field`}: the training run's own
    steps, guidance, frame rate and shape, the shape unless the matrix gives its own (matrix.num_frames, height,
    width: a release evaluation at another shape than training's), and the evaluation's noise seed."""
    fields = {"steps": "grpo.sampling_steps", "guidance_scale": "grpo.guidance_scale", "seed": "matrix.seed"}
    for name in SHAPE:
        fields[name] = f"matrix.{name}" if getattr(cfg.matrix, name) is not None else f"video.{name}"
    fields["fps"] = "video.fps"
    return fields


def generation_settings(cfg: Config) -> dict[str, Any]:
    """The values generation_fields names: {setting: value}."""
    return {name: _value(cfg, path) for name, path in generation_fields(cfg).items()}


def _value(cfg: Config, path: str) -> Any:
    section, _, name = path.partition(".")
    return getattr(getattr(cfg, section), name)


# What each stage reads (whole sections, or single `section.field`s). They are the stage's Snakemake
# params, so changing one reruns it, and nothing else does.
RUN_SECTIONS = (
    "recipe",
    "model",
    "data",
    "video",
    "evalkit",
    "reward",
    "grpo",
    "train",
    "parallel",
    "actors",
    "refiners",
)
STAGE_SECTIONS = {
    "materialize_dataset": ("data",),
    "validate_dataset": ("data",),
    "fingerprint_evalkit": ("evalkit.path", "evalkit.digest", "evalkit.easyocr_models"),
    "check_scorer_runtime": ("evalkit.runtime", "evalkit.python"),
    "preflight": RUN_SECTIONS + ("logging",),
    # kubernetes: `videogrpo stage k8s-job` reads the train stage's file (execution fields: no param, no rerun).
    "train": RUN_SECTIONS + ("logging", "kubernetes"),
    # What eval_set may read: the external tree's pin, or the split it builds the set from (eval_set_fields).
    "eval_set": (
        "matrix.eval_set",
        "matrix.eval_set_digest",
        "matrix.expected_samples",
        "matrix.split",
        "matrix.samples_per_task",
    ),
    "fetch_eval_model": ("matrix.pipeline_sha256",),
    # And the generation settings (generation_fields), which stage_view adds: where they live depends on the config.
    "generate_cell": (
        "model",
        *GENERATION_FIELDS,
        "matrix.procs",
        "parallel.device",
        "parallel.backend",
        "parallel.attention_backend",
        "parallel.cpu_threads",
    ),
    # And the frame count and rate of the videos it scores (generation_fields), which stage_view adds.
    "score_cell": ("evalkit", "matrix.max_seconds", "matrix.bootstrap", "matrix.seed"),
    "matrix": ("matrix.bootstrap", "matrix.seed", "logging"),
    # The training sampler and compare_base: which cells are the held-out check the page shows (config/cells.py).
    "report": ("recipe", "logging", "grpo.sampler", "grpo.eta", "grpo.eta_range", "matrix.compare_base"),
    "fetch_kernel": (
        "parallel.attention_backend",
        "parallel.attention_kernel_repo",
        "parallel.attention_kernel_revision",
    ),
}


DOWNLOADS = {"fetch_model": "model", "fetch_dataset": "data", "fetch_judge": "reward"}


def download_fields(cfg: Config, section: str) -> list[str]:
    """What a download rule fetches or generates, and nothing else: its params, so other fields never re-download."""
    if section == "model":
        # The tiny builder makes the layout model.kind names (one TI2V transformer, or two I2V experts).
        names = ("source", "kind", "tiny_seed") if cfg.model.source == "tiny" else ("source", "repo_id", "revision")
    elif section == "reward":
        names = ("judge_model", "judge_revision")
    elif cfg.data.source == "synthetic":
        names = (
            "source",
            "archive_glob",
            "task_list",
            "samples_per_task",
            "synthetic_seed",
            "gt_frames",
            "gt_height",
            "gt_width",
        )
    else:
        names = ("source", "repo_id", "revision", "archive_glob")
    return [f"{section}.{name}" for name in names]


def eval_set_fields(cfg: Config) -> list[str]:
    """What eval_set reads: the external tree's pin (matrix.eval_set given), or the split of the dataset it builds
    the evaluation set from; never both, so that a field of the other source reruns nothing."""
    if cfg.matrix.eval_set:
        return ["matrix.eval_set", "matrix.eval_set_digest", "matrix.expected_samples"]
    return ["matrix.eval_set", "matrix.split", "matrix.samples_per_task"]


def stage_view(cfg: Config, stage: str) -> dict[str, Any]:
    """The config a stage reads, as nested sections: its Snakemake params, so changing them reruns it."""
    if stage in DOWNLOADS:
        return select(cfg, download_fields(cfg, DOWNLOADS[stage]))
    if stage == "eval_set":
        return select(cfg, eval_set_fields(cfg))
    return select(cfg, [*STAGE_SECTIONS[stage], *GENERATION_STAGES.get(stage, lambda _: [])(cfg)])


# The stages that read generation settings: all of them to generate, the frame count and rate to score.
GENERATION_STAGES = {
    "generate_cell": lambda cfg: list(generation_fields(cfg).values()),
    "score_cell": lambda cfg: [generation_fields(cfg)[name] for name in ("num_frames", "fps")],
}


def flat_fields(view: dict[str, Any]) -> dict[str, Any]:
    """A stage view (nested sections, as `stage_view` gives) as {`section.field`: value}."""
    found = {}
    for section, value in view.items():
        for name, field_value in value.items() if isinstance(value, dict) else [(None, value)]:
            found[f"{section}.{name}" if name else section] = field_value
    return found


# Options beyond the released recipes (docs/options.md): each group's switches with the value that turns them off,
# and the fields that only matter when one is on. While every switch of a group is off, the group's fields are left
# out of the training contract and of the stages' params, so an option added later changes no existing run's
# identity and reruns nothing; turned on, its fields count like any contract field.
OPTION_GROUPS: tuple[tuple[dict[str, Any], tuple[str, ...]], ...] = (
    ({"grpo.clip_range_high": None}, ()),
    ({"grpo.skip_zero_variance_groups": False}, ()),
    ({"grpo.updates_per_batch": 1, "grpo.update_passes": 1}, ("grpo.update_order",)),
    ({"grpo.advantage_std": "group", "grpo.advantage_std_unbiased": True, "grpo.advantage_eps": 1e-4}, ()),
    ({"grpo.drop_zero_advantage": False}, ()),
    ({"train.lr_schedule": "cosine"}, ()),
    ({"train.ema_decay": None}, ("train.ema_every", "train.ema_repeats")),
    ({"grpo.vae_tile_size": None}, ()),
    ({"grpo.grpo_guard": False}, ("grpo.grpo_guard_scope",)),
    (
        {"grpo.algorithm": "grpo"},
        (
            "grpo.nft_beta",
            "grpo.nft_adv_clip",
            "grpo.nft_old_decay_rate",
            "grpo.nft_old_decay_max",
            "grpo.nft_old_decay_after",
        ),
    ),
    (
        {"grpo.sde_window_size": 0},
        ("grpo.sde_window_range", "grpo.sde_window_mode", "grpo.sde_window_stride", "grpo.sde_window_shift_every"),
    ),
    ({"grpo.sde_window_tail": "euler"}, ("grpo.sde_window_tail_ratio",)),
    ({"reward.terms": {}}, ()),
    (
        {"train.lora_rank": 0},
        (
            "train.lora_alpha",
            "train.lora_dropout",
            "train.lora_targets",
            "train.lora_export_merged",
            "train.lora_base_dtype",
        ),
    ),
    (
        {"train.validate_every": 0, "train.validate_before_training": False},
        ("train.validate_prompts", "train.validate_sampler"),
    ),
    (
        {"train.validate_rewards": []},
        (
            "train.validate_rewards_fail_on_error",
            "train.divergence_points",
            "train.divergence_sigmas",
            "train.divergence_min_change",
        ),
    ),
    ({"train.keep_best_by": None}, ()),
    ({"actors.train_ranks": 0, "actors.train_nodes": 0}, ("actors.weight_sync",)),
    ({"actors.asynchronous": False}, ("actors.prefetch", "actors.sync_interval")),
    ({"refiners.experts": []}, ("refiners.credit", "refiners.original_members", "refiners.rewrites_per_prompt")),
    ({"train.stop_on_divergence": False}, ()),
)


def options_off(flat: dict[str, Any]) -> set[str]:
    """The fields of `flat` ({`section.field`: value}) that belong to an option group whose switches are all off."""
    off = set()
    for switches, dependents in OPTION_GROUPS:
        if all(flat.get(path, value) == value for path, value in switches.items()):
            off.update(switches, dependents)
    return off


def options_on(view: dict[str, Any]) -> dict[str, Any]:
    """The switches of the options that are on in a stage view or a config (nested sections), {`section.field`:
    value}: what the report names beside the recipe."""
    flat = flat_fields(view)
    return {
        path: flat[path]
        for switches, _ in OPTION_GROUPS
        for path, value in switches.items()
        if path in flat and flat[path] != value
    }


def identity_fields(view: dict[str, Any]) -> dict[str, Any]:
    """The fields of a stage view (`stage_view`) that say what the stage makes, by `section.field`: contract
    and evaluation fields, but an option that is off (OPTION_GROUPS). They are its Snakemake params and key its
    kept work; execution and cosmetic fields reach it through its config file only."""
    flat = flat_fields(view)
    off = options_off(flat)
    return {
        path: value for path, value in flat.items() if field_class(path) in (CONTRACT, EVALUATION) and path not in off
    }


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


# (section, source) -> the fields of the section that this source does not read, and the value they are read as.
INERT_FIELDS = {
    ("model", "tiny"): {"repo_id": "", "revision": ""},
    ("model", "hub"): {"tiny_seed": 0},
    ("data", "synthetic"): {"repo_id": "", "revision": ""},
}


def effective_dict(cfg: Config) -> dict[str, Any]:
    """The config as nested sections, fields that the chosen source does not read empty (INERT_FIELDS)."""
    full = to_dict(cfg)
    for (section, source), values in INERT_FIELDS.items():
        if full[section]["source"] == source:
            full[section].update(values)
    return full


def select(cfg: Config, paths: list[str]) -> dict[str, Any]:
    """The given fields (`section.field`, or a whole `section`) as nested sections: {"train": {"lr": ...}},
    inert fields empty (effective_dict)."""
    full = effective_dict(cfg)
    view: dict[str, Any] = {}
    for path in paths:
        section, _, name = path.partition(".")
        if name:
            view.setdefault(section, {})[name] = full[section][name]
        else:
            view[section] = full[section]
    return view


def training_contract(cfg: Config, task_list_text: str) -> dict[str, Any]:
    """The contract fields, the task list by its names (not its path). `recipe` names the directory instead."""
    paths = [p for p in fields_of_class(CONTRACT) if p != "recipe"]
    off = options_off(flat_fields(select(cfg, paths)))
    contract = select(cfg, [p for p in paths if p not in off])
    contract["data"]["task_list"] = sorted(task_names(task_list_text))
    if "actors" in contract and cfg.actors.asynchronous and cfg.actors.prefetch is None:
        # The automatic prefetch reads grpo.sample_batch_size, an execution field: the run is the prefetch it gives.
        contract["actors"]["prefetch"] = prefetch(cfg)
    return contract


def task_names(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_task_list_text(path: str | Path) -> str:
    """The task list file's text, or an error naming data.task_list and the fix."""
    try:
        return Path(path).read_text()
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(
            f"data.task_list = {str(path)!r}: no such file; point it at a file listing one task per line "
            f"(config/tasks/ holds the released lists)"
        ) from None


def read_task_list(path: str | Path) -> list[str]:
    return task_names(read_task_list_text(path))


def run_identity(cfg: Config, task_list_text: str | None = None) -> str:
    """`<recipe>-<12 hex>`: the hex digests the canonical training contract."""
    if task_list_text is None:
        task_list_text = read_task_list_text(cfg.data.task_list)
    digest = hashlib.sha256(canonical_json(training_contract(cfg, task_list_text)).encode()).hexdigest()
    return f"{cfg.recipe}-{digest[:12]}"
