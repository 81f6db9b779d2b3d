"""Typed configuration: sections, precedence, validation, run identity.

Precedence: dataclass defaults < config/config.yaml < recipe (--configfile) < --config overrides.
Snakemake merges the YAML layers; `from_dict` fills defaults, coerces the strings that `--config`
produces, and checks every field and every cross-field rule, naming the field, the value and the
rule. The dataclass defaults are the values shared by all released recipes (REFERENCE section 6).

This module must stay light: the Snakefile imports it at parse time (no torch, no diffusers).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from videogrpo.config_types import build, json_schema as _schema_of
from videogrpo.errors import ConfigError

HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class ModelConfig:
    source: str = "hub"
    """Where the base pipeline comes from: `hub` (pinned snapshot) or `tiny` (random, built from configs)."""
    repo_id: str = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    """Hub repository of the complete Diffusers pipeline to start from."""
    revision: str = ""
    """40-hex commit of repo_id; branch and tag names are refused."""
    kind: str = "ti2v"
    """`ti2v` (one transformer, 48-channel latents, clean latent frame 0) or `i2v_a14b` (two experts)."""
    tiny_seed: int = 0
    """Seed of the random weights of the tiny model (source `tiny` only)."""
    max_text_tokens: int = 512
    """Prompt length the text encoder pads or truncates to."""


@dataclass
class DataConfig:
    source: str = "hub"
    """`hub` (pinned dataset snapshot) or `synthetic` (generated here, same archive format)."""
    repo_id: str = "Video-Reason/VBVR-Pro-RL"
    """Hub dataset repository."""
    revision: str = "ca0aaffea93b07d269c6fe2fbfe533f1fdab9aa1"
    """40-hex commit of the dataset repository."""
    archive_glob: str = "VBVR-Pro-RL-Video/*.tar.gz"
    """Archives to download and unpack, relative to the dataset repository."""
    split_name: str = "In-Domain_50"
    """Name recorded in the split manifest for these tasks."""
    task_list: str = "config/tasks/vbvr_in_domain_50.txt"
    """File listing the expected tasks, one per line."""
    samples_per_task: int = 1000
    """Samples each task must have after unpacking."""
    heldout_per_task: int = 4
    """Samples per task held out of training for evaluation (chosen with shuffle_seed)."""
    gt_frames: int | None = None
    """Frame count every ground_truth.mp4 must decode to (null: any)."""
    gt_height: int | None = None
    """Height every ground-truth video must have (null: any)."""
    gt_width: int | None = None
    """Width every ground-truth video must have (null: any)."""
    shuffle_seed: int = 42
    """Seed of the one shuffle of the task-grouped index (shuffle_raw_indices_seed)."""
    synthetic_seed: int = 0
    """Seed of the synthetic generator (source `synthetic` only)."""


@dataclass
class VideoConfig:
    num_frames: int = 81
    """Frames per generated video (4k + 1 for the Wan VAE)."""
    height: int = 512
    """Generated height in pixels (multiple of 32)."""
    width: int = 512
    """Generated width in pixels (multiple of 32)."""
    fps: int = 16
    """Frame rate of written videos."""


@dataclass
class EvalKitConfig:
    path: str = ""
    """Checkout directory of the VBVR-compatible EvalKit (empty: no rule reward)."""
    digest: str = ""
    """64-hex source digest the checkout must have (REFERENCE section 3)."""
    unsupported_score: float = 0.0
    """Score of a task the EvalKit does not know."""
    workers: int = 4
    """Scorer processes per rank."""
    threads_per_worker: int = 4
    """CPU threads each scorer process may use."""
    video_size: int = 1024
    """Side of the square the generated video is resized and padded to before scoring."""
    max_seconds: float = 5.0
    """Longest stretch of generated video handed to the scorer."""
    crf: int = 12
    """x264 quality of the video handed to the scorer."""
    runtime: list[str] = field(default_factory=lambda: [
        "easyocr==1.7.2", "imageio==2.37.3", "imageio-ffmpeg==0.6.0", "norfair==2.3.0", "numpy==2.4.4",
        "opencv-python==4.13.0.92", "opencv-python-headless==4.13.0.92", "pillow==12.2.0",
        "scikit-image==0.26.0", "scipy==1.17.1", "tifffile==2026.3.3",
    ])
    """Scorer runtime contract: `name==version` of every package the scorer processes must see (a list, so a
    recipe replaces it rather than merging into it)."""


@dataclass
class RewardConfig:
    kind: str = "vbvr_rule"
    """`vbvr_rule` (EvalKit evaluators) or `vbvr_vlm` (a VLM judge served by vLLM)."""
    judge_model: str = "Qwen/Qwen3.6-27B"
    """Hub repository of the VLM judge (vbvr_vlm only)."""
    judge_revision: str = "6a9e13bd6fc8f0983b9b99948120bc37f49c13e9"
    """40-hex revision of the judge model."""
    judge_port: int = 18080
    """Loopback port of the per-node judge service."""
    judge_frames: int = 32
    """Frames of the generated video shown to the judge."""
    judge_concurrency: int = 2
    """Judge requests in flight per rank."""


@dataclass
class GRPOConfig:
    sampler: str = "flowcps"
    """Rollout transition: `flowcps`, `dancegrpo` (RF-SDE) or `flowgrpo`."""
    eta: float = 0.7
    """Noise level of the sampler (Flow-CPS 0.7, DanceGRPO 0.3)."""
    eta_range: list[float] | None = None
    """Draw one eta per prompt uniformly from [lo, hi] (grpo_cps_noise_scale_range); null: fixed eta."""
    sampling_steps: int = 30
    """Denoising steps per rollout (T)."""
    shift: float = 5.0
    """Flow-matching time shift of the sigma schedule."""
    guidance_scale: float = 1.0
    """Classifier-free guidance scale (1.0: no unconditional pass)."""
    group_size: int = 32
    """Rollouts per prompt (G)."""
    prompts_per_step: int = 32
    """Prompts per optimizer step, over all ranks."""
    shared_prompts: bool = True
    """Shared-prompt mode: the ranks of a wave split each prompt's group between them."""
    prompts_per_wave: int | None = None
    """Prompts rolled out at once in shared-prompt mode (grpo_shared_prompt_microbatch_size); null: all."""
    timestep_fraction: float = 0.6
    """Fraction of the first T - 1 timesteps trained per update."""
    clip_range: float = 1e-4
    """PPO clip range on-policy (grpo_clip_range)."""
    delayed_replay: bool = True
    """One-step-delayed replay: roll out the next batch while the previous one's rewards finish."""
    delayed_clip_range: float = 1e-2
    """PPO clip range under delayed replay."""
    kl_coeff: float = 0.0
    """Weight of the KL to the frozen reference policy."""
    share_group_noise: bool = True
    """All members of a group start from one initial noise (dancegrpo_share_group_init_noise)."""


@dataclass
class TrainConfig:
    lr: float = 5e-6
    """Peak learning rate of AdamW."""
    warmup_steps: int = 5
    """Linear warm-up, in optimizer updates."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    epochs: int = 5
    """Passes over the training prompts."""
    max_steps: int | None = None
    """Stop after this many optimizer updates (null: run all epochs)."""
    batch_size: int = 1
    """Prompts per data replica per step outside shared-prompt mode."""
    save_steps: int = 100
    """Checkpoint every this many optimizer updates."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept; older ones are deleted."""
    seed: int = 42
    """Seed of every random draw of the run."""
    auto_resume: bool = True
    """Restore the newest complete checkpoint of the run directory."""
    resume_from: str | None = None
    """Checkpoint to initialise from (see reset_dataloader)."""
    reset_dataloader: bool = True
    """With resume_from: load weights only (true) or resume all state (false)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass."""


@dataclass
class ParallelConfig:
    nodes: int = 16
    """Machines of the training job."""
    procs_per_node: int = 8
    """Training processes (usually GPUs) per machine."""
    data_parallel: str = "hsdp"
    """Weight layout: `replicate` (all-reduce), `fsdp` or `hsdp` (FSDP2)."""
    shard_group_size: int = 8
    """Ranks one HSDP shard group spans."""
    tensor_parallel: int = 1
    """Tensor-parallel degree."""
    device: str = "cuda"
    """`cuda` or `cpu`."""
    backend: str = "nccl"
    """torch.distributed backend: `nccl` or `gloo`."""
    attention_backend: str = "_flash_3_hub"
    """diffusers attention backend (`native` works everywhere)."""
    compile: bool = True
    """torch.compile the transformer blocks."""
    param_dtype: str = "bfloat16"
    """Dtype of parameters in compute."""
    reduce_dtype: str = "float32"
    """Dtype of gradient reduction."""
    master_port: int = 29500
    """Rendezvous port on the first node (under SLURM: plus the job id modulo 1000)."""
    cpu_threads: int = 4
    """torch CPU threads per training process; equal values make CPU runs bit-identical across topologies."""


@dataclass
class EvaluateConfig:
    max_samples_per_task: int | None = None
    """Held-out samples scored per task (null: all)."""
    sampler: str = "flowcps"
    """Sampler of evaluation rollouts."""
    eta: float = 0.0
    """Noise level of evaluation rollouts (0: the deterministic Euler ODE)."""
    sampling_steps: int | None = None
    """Denoising steps (null: grpo.sampling_steps)."""
    seed: int = 1234
    """Seed of the evaluation noise."""
    compare_base: bool = True
    """Also score the untrained base model on the same samples and noise."""


@dataclass
class LoggingConfig:
    wandb_mode: str = "offline"
    """W&B mode: `offline`, `online` or `disabled`."""
    wandb_project: str = "videogrpo"
    """W&B project."""


@dataclass
class SlurmConfig:
    partition: str = ""
    """Partition of compute jobs (empty: the cluster's default)."""
    account: str = ""
    """Account to charge (empty: none)."""
    constraint: str = ""
    """Node feature constraint of GPU jobs, e.g. `h100` (empty: none)."""
    gpus_per_node: int | None = None
    """GPUs per node of training and evaluation (null: parallel.procs_per_node on cuda, none on cpu)."""
    cpus_per_node: int = 64
    """CPU cores per node of a training job (rollout decoding and the reward pool use them)."""
    mem_mb_per_node: int = 512000
    """Memory per node of a training job, in MB."""
    train_minutes: int = 2880
    """Wall-time limit of a training job; a job killed at the limit resumes from its last checkpoint."""
    evaluate_minutes: int = 600
    """Wall-time limit of the evaluation job."""
    data_cpus: int = 16
    """CPU cores of the data and scorer-runtime jobs."""
    data_mem_mb: int = 32000
    """Memory of the data and scorer-runtime jobs, in MB."""
    data_minutes: int = 480
    """Wall-time limit of the data jobs."""


@dataclass
class Config:
    recipe: str = "custom"
    """Name of the recipe; the first part of the run directory name."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    evalkit: EvalKitConfig = field(default_factory=EvalKitConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    results: str = "results"
    """Directory all outputs go under."""

    @property
    def world_size(self) -> int:
        return self.parallel.nodes * self.parallel.procs_per_node


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}

CHOICES = {
    "model.source": ("hub", "tiny"),
    "model.kind": ("ti2v", "i2v_a14b"),
    "data.source": ("hub", "synthetic"),
    "reward.kind": ("vbvr_rule", "vbvr_vlm"),
    "grpo.sampler": ("flowcps", "dancegrpo", "flowgrpo"),
    "evaluate.sampler": ("flowcps", "dancegrpo", "flowgrpo"),
    "parallel.data_parallel": ("replicate", "fsdp", "hsdp"),
    "parallel.device": ("cpu", "cuda"),
    "parallel.backend": ("gloo", "nccl"),
    "parallel.param_dtype": ("float32", "bfloat16", "float16"),
    "parallel.reduce_dtype": ("float32", "bfloat16"),
    "logging.wandb_mode": ("offline", "online", "disabled"),
}
POSITIVE = {
    "model.max_text_tokens", "data.samples_per_task", "video.num_frames", "video.height", "video.width",
    "video.fps", "evalkit.workers", "evalkit.threads_per_worker", "evalkit.video_size", "evalkit.max_seconds",
    "reward.judge_frames", "reward.judge_concurrency", "grpo.sampling_steps", "grpo.shift", "grpo.group_size",
    "grpo.prompts_per_step", "grpo.prompts_per_wave", "grpo.clip_range", "grpo.delayed_clip_range",
    "train.lr", "train.epochs", "train.max_steps", "train.batch_size", "train.save_steps",
    "train.keep_checkpoints", "train.max_grad_norm", "parallel.nodes", "parallel.procs_per_node",
    "slurm.cpus_per_node", "slurm.mem_mb_per_node", "slurm.train_minutes", "slurm.evaluate_minutes",
    "slurm.data_cpus", "slurm.data_mem_mb", "slurm.data_minutes",
    "parallel.shard_group_size", "parallel.tensor_parallel", "parallel.cpu_threads", "evaluate.sampling_steps",
}
NON_NEGATIVE = {
    "data.heldout_per_task", "grpo.eta", "grpo.kl_coeff", "grpo.guidance_scale", "train.warmup_steps",
    "train.weight_decay", "evaluate.eta", "evaluate.max_samples_per_task", "evalkit.crf", "model.tiny_seed",
    "slurm.gpus_per_node",
}

# What defines a training run: changing any of it must give a new run directory (DESIGN: run identity).
TRAINING_CONTRACT = {
    "model": None, "data": None, "video": None, "reward": None, "grpo": None, "parallel": None,
    "evalkit": ("digest", "unsupported_score", "video_size", "max_seconds", "crf", "runtime"),
    "train": ("lr", "warmup_steps", "weight_decay", "max_grad_norm", "epochs", "max_steps", "batch_size",
              "save_steps", "seed", "resume_from", "reset_dataloader", "gradient_checkpointing"),
}


def from_dict(data: dict[str, Any], partial: bool = False) -> Config:
    """Fill defaults, coerce, and validate a merged config mapping.

    With `partial`, only the sections present are validated: a stage receives just the sections it
    reads, so that changing another section does not rerun it.
    """
    cfg = build(Config, copy.deepcopy(data), "")
    validate(cfg, set(data) if partial else None)
    return cfg


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


def _get(cfg: Config, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _field_problems(cfg: Config, sections: set[str]) -> list[str]:
    found = []
    for path, allowed in CHOICES.items():
        value = _get(cfg, path)
        if path.split(".")[0] in sections and value not in allowed:
            found.append(f"{path} = {value!r}: must be one of {', '.join(allowed)}")
    for paths, test, rule in ((POSITIVE, lambda v: v <= 0, "> 0"), (NON_NEGATIVE, lambda v: v < 0, ">= 0")):
        for path in sorted(paths):
            value = _get(cfg, path)
            if path.split(".")[0] in sections and value is not None and test(value):
                found.append(f"{path} = {value!r}: must be {rule}")
    return found


def _model_problems(cfg: Config) -> list[str]:
    if cfg.model.source == "hub" and not HEX40.match(cfg.model.revision):
        return [f"model.revision = {cfg.model.revision!r}: must be a 40-hex commit id (branch names are refused)"]
    return []


def _data_problems(cfg: Config) -> list[str]:
    found = []
    if cfg.data.source == "hub" and not HEX40.match(cfg.data.revision):
        found.append(f"data.revision = {cfg.data.revision!r}: must be a 40-hex commit id (branch names are refused)")
    if cfg.data.heldout_per_task == 0:
        found.append("data.heldout_per_task = 0: the evaluate stage needs held-out samples; set it to 1 or more")
    if cfg.data.heldout_per_task >= cfg.data.samples_per_task:
        found.append(
            f"data.heldout_per_task = {cfg.data.heldout_per_task}: must be < data.samples_per_task "
            f"= {cfg.data.samples_per_task}, or nothing is left to train on"
        )
    return found


def _evalkit_problems(cfg: Config) -> list[str]:
    found = []
    if cfg.evalkit.path and not HEX64.match(cfg.evalkit.digest):
        found.append(f"evalkit.digest = {cfg.evalkit.digest!r}: must be the 64-hex source digest of {cfg.evalkit.path}")
    for i, pin in enumerate(cfg.evalkit.runtime):
        if not re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", pin):
            found.append(f"evalkit.runtime[{i}] = {pin!r}: must be 'name==version'")
    return found


def runtime_contract(cfg: Config) -> dict[str, str]:
    """evalkit.runtime as {distribution name: version}."""
    return dict(pin.split("==", 1) for pin in cfg.evalkit.runtime)


def _reward_problems(cfg: Config) -> list[str]:
    if cfg.reward.kind == "vbvr_rule" and not cfg.evalkit.path:
        return ["evalkit.path = '': the vbvr_rule reward needs an EvalKit checkout directory"]
    if cfg.reward.kind == "vbvr_vlm" and not HEX40.match(cfg.reward.judge_revision):
        return [f"reward.judge_revision = {cfg.reward.judge_revision!r}: must be a 40-hex commit id"]
    return []


def _video_problems(cfg: Config) -> list[str]:
    found = []
    if cfg.video.num_frames % 4 != 1:
        found.append(f"video.num_frames = {cfg.video.num_frames}: must be 4k + 1 (the Wan VAE compresses time by 4)")
    for side in ("height", "width"):
        value = getattr(cfg.video, side)
        if value % 32:
            found.append(f"video.{side} = {value}: must be a multiple of 32 (VAE factor 16 x patch 2)")
    return found


def _grpo_problems(cfg: Config) -> list[str]:
    found = []
    lo_hi = cfg.grpo.eta_range
    if lo_hi is not None and (len(lo_hi) != 2 or not 0 <= lo_hi[0] <= lo_hi[1] <= 1):
        found.append(f"grpo.eta_range = {lo_hi}: must be [lo, hi] with 0 <= lo <= hi <= 1")
    if not 0 < cfg.grpo.timestep_fraction <= 1:
        found.append(f"grpo.timestep_fraction = {cfg.grpo.timestep_fraction}: must be in (0, 1]")
    if cfg.grpo.sampling_steps < 2:
        found.append(f"grpo.sampling_steps = {cfg.grpo.sampling_steps}: must be >= 2 (the last step is never trained)")
    if cfg.grpo.delayed_replay and not cfg.grpo.shared_prompts:
        found.append("grpo.delayed_replay = true: needs grpo.shared_prompts = true (REFERENCE section 4)")
    return found


def _parallel_problems(cfg: Config) -> list[str]:
    if cfg.parallel.device == "cpu" and cfg.parallel.backend == "nccl":
        return ["parallel.backend = 'nccl': NCCL needs parallel.device = 'cuda'; use 'gloo' on CPU"]
    return []


# Each cross-field rule runs when every section it reads is present (stages receive only their sections).
CHECKS = (
    (("model",), _model_problems),
    (("data",), _data_problems),
    (("evalkit",), _evalkit_problems),
    (("reward", "evalkit"), _reward_problems),
    (("video",), _video_problems),
    (("grpo",), _grpo_problems),
    (("parallel",), _parallel_problems),
    (("grpo", "parallel", "train"), lambda cfg: topology_problems(cfg)),
)


def problems(cfg: Config, sections: set[str] | None = None) -> list[str]:
    """Every rule the config breaks, each naming the field, the value and the rule."""
    sections = set(SECTIONS) if sections is None else set(sections)
    found = _field_problems(cfg, sections)
    if "recipe" in sections and not re.fullmatch(r"[A-Za-z0-9_.-]+", cfg.recipe):
        found.append(f"recipe = {cfg.recipe!r}: use letters, digits, '_', '.', '-' (it names the run directory)")
    for needed, check in CHECKS:
        if sections.issuperset(needed):
            found += check(cfg)
    return found


def topology_problems(cfg: Config) -> list[str]:
    """World size vs prompts vs group size (REFERENCE section 4, shared-prompt mode)."""
    p, g = cfg.grpo, cfg.parallel
    world = cfg.world_size
    found = []
    if g.tensor_parallel > 1 and world % g.tensor_parallel:
        found.append(f"parallel.tensor_parallel = {g.tensor_parallel}: must divide the world size {world} "
                     f"(= nodes {g.nodes} x procs_per_node {g.procs_per_node})")
        return found
    if g.data_parallel == "hsdp" and world % g.shard_group_size:
        found.append(f"parallel.shard_group_size = {g.shard_group_size}: must divide the world size {world} "
                     f"(= nodes {g.nodes} x procs_per_node {g.procs_per_node})")
    if p.shared_prompts:
        wave = p.prompts_per_wave or p.prompts_per_step
        if p.prompts_per_step % wave:
            found.append(f"grpo.prompts_per_wave = {wave}: must divide grpo.prompts_per_step = {p.prompts_per_step}")
        elif world % wave:
            found.append(
                f"world size {world} (= nodes {g.nodes} x procs_per_node {g.procs_per_node}) must be a multiple "
                f"of the prompts per wave {wave} (grpo.prompts_per_wave or grpo.prompts_per_step) in shared-prompt mode"
            )
        elif p.group_size % (world // wave):
            found.append(
                f"grpo.group_size = {p.group_size}: must be a multiple of the {world // wave} ranks sharing each "
                f"prompt (world size {world} / {wave} prompts per wave)"
            )
    else:
        replicas = world // g.tensor_parallel
        if p.prompts_per_step != cfg.train.batch_size * replicas:
            found.append(
                f"grpo.prompts_per_step = {p.prompts_per_step}: must equal train.batch_size {cfg.train.batch_size} "
                f"x {replicas} data replicas (world size {world} / tensor_parallel {g.tensor_parallel})"
            )
    return found


def validate(cfg: Config, sections: set[str] | None = None) -> None:
    found = problems(cfg, sections)
    if found:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(found))


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


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def training_contract(cfg: Config, task_list_text: str) -> dict[str, Any]:
    full = to_dict(cfg)
    contract = {}
    for section, keys in TRAINING_CONTRACT.items():
        values = full[section]
        contract[section] = values if keys is None else {k: values[k] for k in keys}
    contract["data"] = dict(contract["data"], task_list=sorted(_task_names(task_list_text)))
    return contract


def _task_names(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_task_list(path: str | Path) -> list[str]:
    try:
        return _task_names(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"data.task_list = {str(path)!r}: file not found") from None


def run_identity(cfg: Config, task_list_text: str | None = None) -> str:
    """`<recipe>-<12 hex>`: the hex digests the canonical training contract."""
    if task_list_text is None:
        task_list_text = Path(cfg.data.task_list).read_text()
    digest = hashlib.sha256(canonical_json(training_contract(cfg, task_list_text)).encode()).hexdigest()
    return f"{cfg.recipe}-{digest[:12]}"


def json_schema() -> dict[str, Any]:
    """JSON Schema of the config, generated from the dataclasses (defaults and descriptions included)."""
    return _schema_of(Config, CHOICES)
