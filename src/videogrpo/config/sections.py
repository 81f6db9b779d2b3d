"""The config sections: typed dataclasses, one docstring per field (the schema's descriptions).

The dataclass defaults are the values shared by all released recipes (docs/reference-system.md#recipes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from videogrpo.config.actors_section import ActorsConfig
from videogrpo.config.grpo_section import GRPOConfig
from videogrpo.config.refiners_section import RefinersConfig


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
    frozen_dtype: str = "bfloat16"
    """Dtype of the text encoder's and the VAE's weights (bf16 in the recipes, as the reference; float32 where
    bf16 is slow, as on CPU)."""
    prompt_cache_bytes: int = 1 << 30
    """Bytes of prompt embeddings kept on CPU for reuse, least recently used evicted first (0: no cache)."""
    condition_dtype: str = "bfloat16"
    """Precision of the first-frame condition: `bfloat16` as the reference (pixels scaled in bf16, the latent
    normalised in the VAE's dtype, then rounded to bf16) or `float32` (diffusers' arithmetic, all float32)."""


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
    heldout_per_task: int = 0
    """Samples per task held out of training (chosen with shuffle_seed) for matrix.split `heldout`; the
    released recipes train on every sample (0)."""
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
    verify_existing: bool = False
    """Hash every file kept from an earlier unpack against its archive's record (not only size and mtime), and
    rewrite and name each one that differs."""
    max_member_mb: float = 256.0
    """Largest archive member accepted, in MiB; a bigger one fails the unpack at that member."""
    inflater: str = "auto"
    """gzip inflater: `auto` (ISA-L when installed, else zlib), `isal` or `zlib`; all check the stream alike."""


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
    """64-hex source digest the checkout must have (docs/reference-system.md#rule-reward)."""
    unsupported_score: float = 0.0
    """Score of a task the EvalKit does not know."""
    fail_on_error: bool = True
    """A sample whose scoring fails (an evaluator `error`, an exception, a missing file, a score outside [0, 1])
    stops the run (true), or scores 0 (an evaluator `error`) or unsupported_score and is counted in the
    `reward_errors` metric (false; vbvr_reward_fail_on_error: false in the 5B recipes, true in A14B)."""
    python: str = ""
    """Interpreter of the scorer's own environment (`make scorer-env`: .venv-scorer/bin/python) that every scorer
    process, the runtime probe and preflight's task listing run; empty: this one."""
    easyocr_models: str = "easyocr_models"
    """EasyOCR model folder the scorer workers use (EASYOCR_MODULE_PATH), relative to the checkout."""
    workers: int = 4
    """Scorer processes per rank."""
    threads_per_worker: int = 4
    """CPU threads each scorer process may use."""
    video_size: int = 1024
    """Side of the square the generated video is resized and padded to before scoring."""
    max_seconds: float = 5.0
    """Duration cap of the video handed to the scorer: every frame is kept and the frame rate raised to
    max(video.fps, ceil(frames / max_seconds)) (vbvr_reward_max_duration_seconds; 5.0625 in the 5B recipes)."""
    crf: int = 12
    """x264 quality of the video handed to the scorer."""
    runtime: list[str] = field(
        default_factory=lambda: [
            "easyocr==1.7.2",
            "imageio==2.37.3",
            "imageio-ffmpeg==0.6.0",
            "norfair==2.3.0",
            "numpy==2.4.4",
            "opencv-python==4.13.0.92",
            "opencv-python-headless==4.13.0.92",
            "pillow==12.2.0",
            "scikit-image==0.26.0",
            "scipy==1.17.1",
            "tifffile==2026.3.3",
        ]
    )
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
    judge_prompts: str = ""
    """Rubric source: a Python module defining EVAL_PROMPTS (task -> rubric text); not vendored (vbvr_vlm)."""
    judge_prompts_digest: str = ""
    """64-hex plain SHA-256 of the rubric source file."""
    judge_protocol: str = ""
    """Protocol source: a Python module defining the judge's fixed texts TASK_VLM_JUDGE_OUTPUT_REMINDER and
    TASK_VLM_JUDGE_REPAIR_PROMPT (string literals, parsed, never executed); not vendored (vbvr_vlm)."""
    judge_protocol_digest: str = ""
    """64-hex plain SHA-256 of the protocol source file."""
    judge_fps: int = 16
    """Frame rate of the rollout MP4 sent to the judge (vlm_reward_video_fps; every frame kept)."""
    judge_served_name: str = "qwen3.6-27b"
    """Model name the judge service serves and requests name."""
    judge_error_score: float = 0.0
    """Score of a rollout the judge could not score after every retry."""
    judge_fail_on_error: bool = False
    """Stop the run when the judge cannot score a rollout (false: score judge_error_score, count reward_errors)."""
    judge_max_retries: int = 2
    """Retries of a failed request or an invalid answer (backoff 1 s x 2^attempt)."""
    judge_timeout_s: float = 300.0
    """Seconds one judge request may take."""
    judge_endpoint: str = ""
    """An existing OpenAI-compatible judge service (e.g. http://host:18080); empty: the training job starts one
    per node on judge_port."""
    judge_serve_command: list[str] = field(
        default_factory=lambda: [
            "{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
            "--served-model-name", "{name}", "--host", "127.0.0.1", "--port", "{port}",
            "--tensor-parallel-size", "{tensor_parallel}", "--data-parallel-size", "{data_parallel}",
            "--gpu-memory-utilization", "{gpu_memory}", "--max-model-len", "{max_model_len}",
            "--max-num-seqs", "{max_num_seqs}",
        ]
    )  # fmt: skip
    """Command that starts the per-node judge service; {placeholders} are filled from the judge_* fields."""
    judge_python: str = ""
    """Interpreter of the judge's own environment (empty: this one)."""
    judge_tensor_parallel: int = 2
    """GPUs per judge replica."""
    judge_data_parallel: int = 4
    """Judge replicas per node."""
    judge_gpu_memory: float = 0.5
    """Share of each GPU's memory the judge may take (the rest is training's)."""
    judge_max_model_len: int = 32768
    """Longest context the judge service accepts."""
    judge_max_num_seqs: int = 32
    """Sequences the judge service runs at once."""
    judge_ready_timeout_s: float = 1800.0
    """Seconds to wait for the judge service to answer before the run fails."""
    terms: dict[str, float] = field(default_factory=dict)
    """Several rewards: reward kind (`vbvr_rule`, `vbvr_vlm`) -> weight (finite, non-zero, with a non-zero sum;
    negative: a penalty); the advantage is taken from the weighted sum and each term's raw mean is logged
    (`reward/<kind>`); each term fails as its own fail_on_error says (evalkit.fail_on_error, judge_fail_on_error),
    and every term's runtime is started and checked. reward.kind must be one of the terms. Empty: reward.kind alone,
    as the reference."""


@dataclass
class TrainConfig:
    lr: float = 5e-6
    """Peak learning rate of AdamW."""
    warmup_steps: int = 5
    """Linear warm-up, in optimizer updates."""
    lr_schedule: str = "cosine"
    """After the warm-up: `cosine`, decay to 0 at the run's last update (the reference); `constant`, the peak
    throughout (Flow-GRPO, MixGRPO, DiffusionNFT)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    ema_decay: float | None = None
    """An exponential moving average of the trained weights (docs/options.md#an-ema-of-the-weights), exported as ema/
    beside final/ and evaluated where matrix.models names `ema`: its decay ceiling, in (0, 1). Each step blends
    ema <- ema + (1 - d) (w - ema) with d = min((1 + n) / (10 + n), ema_decay) after n optimizer updates (Flow-GRPO's
    and DiffusionNFT's warm-up). null: none (the reference)."""
    ema_every: int = 1
    """The EMA steps after every ema_every-th optimizer update: after update n when n + 1 is a multiple of it
    (Flow-GRPO: 8; DiffusionNFT: 1)."""
    ema_repeats: int = 1
    """Blends at each of those steps. Flow-GRPO's loop steps the EMA after each of its micro-batches with the count of
    updates so far, so it blends once per micro-batch of an update (its gradient accumulation: 2 in
    Flow-GRPO-Fast, 4 in GRPO-Guard); 1: one blend (DiffusionNFT)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    epochs: int = 5
    """Passes over the training prompts."""
    max_steps: int | None = None
    """Stop after this many optimizer updates (null: run all epochs)."""
    batch_size: int = 1
    """Prompts per data replica per step outside shared-prompt mode."""
    experts: str = "both"
    """Experts of a two-expert model (model.kind i2v_a14b) trained: `both`, or `high` / `low` (only that expert
    is loaded and serves every step; train_experts); a one-transformer model (ti2v) takes `both` only."""
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
    resume_across_code_changes: bool = False
    """Resume a checkpoint although the trainer's math code changed since it was written (refused otherwise,
    naming the changed files)."""
    retries: int = 1
    """Times a failed training job is started again, resuming from its last checkpoint: Snakemake's resubmissions
    of the train rule (a SLURM job killed at its time limit, a plugin pod), or each node's restarts in the
    multi-node Kubernetes Job; no other stage is started again, since its failures repeat."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass."""
    offload_inference_models: bool = True
    """Keep the text encoder and VAE on CPU except while they encode or decode, park trajectories on CPU
    between rollout and replay, and empty the allocator cache before replay (docs/reference-system.md#memory)."""
    lora_rank: int = 0
    """Rank of LoRA adapters (peft) trained instead of the full transformer(s), the base weights frozen; 0: full
    fine-tuning, as the reference. Checkpoints hold the adapters only; the export writes Diffusers' LoRA file per
    trained transformer folder; refused with parallel.tensor_parallel > 1 (docs/options.md#lora)."""
    lora_alpha: float | None = None
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank); null: lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapters' input, in every forward of the policy in train mode (rollouts included)."""
    lora_targets: list[str] = field(
        default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]
    )
    """Module names (peft target_modules, matched as name suffixes) the adapters wrap: by default every attention
    projection (self and cross attention) and both FFN projections of each Wan block."""
    lora_export_merged: bool = False
    """Also export the transformer(s) with the adapters merged in (the adapters alone are always exported)."""
    lora_base_dtype: str = "compute"
    """The frozen base's dtype under LoRA: `compute` (parallel.param_dtype: bf16 in the recipes, half the memory of
    float32) or `float32` (the weights exactly as downloaded). The adapters are float32 master weights either way."""
    validate_every: int = 0
    """Validate every this many optimizer updates (and after the last): held-out prompts rolled out with fixed
    noise and validate_sampler, scored by the training reward, logged as `val/*` metrics at the update's step,
    before its checkpoint; 0: never (docs/options.md#validation-during-training). Needs data.heldout_per_task > 0."""
    validate_before_training: bool = False
    """Validate once before the first update (at update 0), on a fresh start (a resumed run has its point 0)."""
    validate_prompts: int = 8
    """Most held-out prompts a validation rolls out, one video each: the first of the held-out split
    (data.heldout_per_task), dealt over the data replicas."""
    validate_sampler: str = "euler"
    """Sampler of the validation rollouts, a matrix sampler name (`euler`, `unipc`, `flowcps-<eta>`, ...)."""
    validate_rewards: list[str] = field(default_factory=list)
    """Gold rewards (docs/options.md#gold-rewards-and-the-divergence-alarm): reward kinds (vbvr_rule, vbvr_vlm) that
    also score each validation point's videos, logged as `val/<kind>/*`, and never trained on (none of them may be a
    training reward). Empty: off."""
    validate_rewards_fail_on_error: bool = False
    """A gold reward's failure (a sample it cannot score, or its scorer down) stops training: true; false leaves the
    failed samples out of its numbers (counted in `val/<kind>/reward_errors`) and training goes on."""
    divergence_points: int = 2
    """The divergence alarm compares each validation point with the one this many points earlier."""
    keep_best_by: str | None = None
    """A gold reward (one of validate_rewards): the export also holds best/, the weights of the validation point it
    scored best, with the update and how it was chosen (best.json); null: final/ only."""
    divergence_sigmas: float = 1.0
    """The alarm fires where, between the two points, the training reward rose and a gold reward fell by more than
    this many standard errors of its paired change (overall, or within any one task)."""
    divergence_min_change: float = 0.0
    """The alarm also asks the gold reward's mean to fall by more than this (in the reward's units): validation's fixed
    noise leaves little spread in the per-prompt changes, so a tiny fall can exceed its standard error. 0: any fall
    beyond the standard errors counts."""
    stop_on_divergence: bool = False
    """When the alarm fires, stop training at the next checkpoint (train.save_steps) and export the weights so far;
    a rerun does not train past it unless train.resume_past_divergence is set."""
    resume_past_divergence: bool = False
    """A run the divergence alarm stopped trains on to its end when rerun (the alarm stays on record)."""


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
    attention_kernel_repo: str = "kernels-community/flash-attn3"
    """Hub kernel repository a `*_hub` attention backend loads (fetch_kernel downloads it; the one diffusers names
    for that backend)."""
    attention_kernel_revision: str = "43f0bd269777115d94ff826e0d113ce9c1c9087b"
    """40-hex commit of attention_kernel_repo that fetch_kernel pins and training loads offline."""
    compile: bool = True
    """torch.compile the transformer blocks."""
    param_dtype: str = "bfloat16"
    """Compute dtype of the transformer's forward and backward; master weights and AdamW state stay float32."""
    reduce_dtype: str = "float32"
    """Dtype of gradient reduction."""
    master_port: int = 29500
    """Rendezvous port on the first node (under SLURM: plus the job id modulo 1000)."""
    cpu_threads: int = 4
    """torch CPU threads per training process; equal values make CPU runs bit-identical across topologies."""
    device_memory_gib: float | None = None
    """Memory of one device in GiB that preflight's memory plan is checked against (null: probe torch.cuda on
    the node preflight runs on; a number plans for the cluster's GPUs from a login node)."""
    offload_optimizer: bool = False
    """Keep the AdamW moments, a float32 copy of the master weights' local shard and a gradient buffer in host memory
    (pinned on CUDA) and step the optimizer there: the same update, 8 B per trained parameter's shard off each device,
    16 B onto its host (docs/options.md#optimizer-and-gradient-offload)."""
    offload_gradients: bool = False
    """Move the reduced, clipped gradients to host memory before the optimizer step, so the device holds none
    during it (they still accumulate on the device through the backward passes); needs offload_optimizer."""


PUBLISHED_PIPELINE_SHA256 = "968acf1b214bce097f4d034bf26923dbf496ac319c1adb6560c16089f2ab0e50"


@dataclass
class MatrixConfig:
    eval_set: str = ""
    """Flattened evaluation tree (`In-Domain_50/<task>/<index>/`, ...) holding split_manifest.json, such as the
    release evaluation set; empty: the evaluation set is built from the dataset's `split`."""
    eval_set_digest: str = ""
    """64-hex tree digest the evaluation tree must have (every file, split_manifest.json included); required
    with eval_set."""
    expected_samples: int = 500
    """Samples the evaluation tree's split_manifest.json must list (the release split: 500)."""
    split: str = "rl"
    """Samples of the evaluation set built from the dataset (eval_set empty): `heldout` (held out of training by
    data.heldout_per_task) or `rl` (training prompts, sampled with fresh noise: the recipes train on every sample)."""
    samples_per_task: int | None = 4
    """Samples per task of the evaluation set built from the dataset: the first of each task in `split` (null:
    all of them)."""
    models: list[str] = field(default_factory=list)
    """Models evaluated under every sampler, one matrix row each: `base` (model.*), `trained` (the run's exported
    final transformer), `best` (its best validation point's, train.keep_best_by), `ema` (train.ema_decay), `refined`
    and `base_refiners` (the trained transformer behind the trained prompt refiners, or behind those it started from:
    the refiners section) or a name in hub_models. The held-out check's cells come in any case (compare_base)."""
    compare_base: bool = True
    """The held-out check, always evaluated: the trained model and, unless this is false, the base model, both
    under the training sampler (grpo.sampler at grpo.eta, or grpo.eta_range) on the same samples and noise."""
    hub_models: dict[str, str] = field(default_factory=dict)
    """Pinned Hub pipelines to evaluate, name -> `repo_id@<40-hex revision>`."""
    pipeline_sha256: str = PUBLISHED_PIPELINE_SHA256
    """SHA-256 a hub model's custom pipeline.py must have (any other is refused;
    docs/reference-system.md#evaluation)."""
    samplers: list[str] = field(
        default_factory=lambda: ["flowcps-0.1", "flowcps-0.3", "flowcps-0.7", "flowcps-0.9", "euler", "unipc"]
    )
    """Samplers, one matrix column each: `unipc` (UniPC ODE), `euler` (Euler ODE), `flowcps-<eta>`,
    `dancegrpo-<eta>`, `flowgrpo`, `flowgrpo_sde-<eta>`, or `flowcps-uniform-<lo>-<hi>` (each sample's eta drawn
    from the range)."""
    seed: int = 0
    """Base seed: sample i of the evaluation set draws its noise from (seed, i), and the bootstrap draws from it;
    its own field, since the evaluation's noise stays fixed (the release evaluation's 0) whatever train.seed is.
    Every cell samples with the training run's grpo.sampling_steps and grpo.guidance_scale."""
    num_frames: int | None = None
    """Frames per generated video (null: video.num_frames); the release evaluation of a recipe that trains at
    another shape sets it (rl_a14b_rule: 81)."""
    height: int | None = None
    """Generated height in pixels (null: video.height)."""
    width: int | None = None
    """Generated width in pixels (null: video.width)."""
    procs: int = 1
    """Generation processes per cell job: one per GPU of the node (data parallel), CPU processes on cpu."""
    bootstrap: int = 2000
    """Bootstrap resamples of the 95 % intervals (over samples) of the matrix and its per-task table."""
    max_seconds: float = 5.0
    """Duration cap of evaluation scorer videos: they play at max(video.fps, ceil(frames / max_seconds)) (the release
    evaluation's 5 s: 81 frames at 17 fps; the training reward's cap is evalkit.max_seconds)."""


@dataclass
class LoggingConfig:
    tracker: list[str] = field(default_factory=lambda: ["wandb"])
    """Trackers of the training metrics besides metrics.jsonl: `wandb`, `mlflow` (both at once allowed), or
    `[none]`; MLflow needs $MLFLOW_TRACKING_URI (docs/tracking.md)."""
    wandb_mode: str = "offline"
    """W&B mode: `offline`, `online` or `disabled` (no W&B run, even where `tracker` lists wandb alone)."""
    wandb_project: str = "videogrpo"
    """W&B project."""
    mlflow_experiment: str = "videogrpo"
    """MLflow experiment of the run (created when missing)."""


@dataclass
class KubernetesConfig:
    """The multi-node training Job's own settings under profiles/kubernetes (launch/k8s_job.py). Its image,
    namespace, service account and privileged mode are the executor plugin's flags, and its pods' CPUs, memory,
    /dev/shm, GPU manufacturer and node type the train rule's resources (the profile's set-resources)."""

    volume_claim: str = ""
    """ReadWriteMany PersistentVolumeClaim that holds the workflow directory, mounted in every pod of a
    multi-node training Job (the nodes of one run share its checkpoints and outputs)."""
    volume_path: str = ""
    """Where volume_claim is mounted: the driver runs Snakemake from a directory under it, which the Job's pods
    see at the same path."""
    train_as_job: bool = False
    """Train a one-node run as a training Job of one pod too (its /dev/shm sized by the train rule's shm_mb; the
    executor plugin's pods have the container runtime's default); runs of several nodes always are one."""
    env_secret: str = ""
    """Secret in the namespace whose keys become the training Job's pods' environment (envFrom): the tracker's
    (MLFLOW_TRACKING_URI and its credentials, WANDB_API_KEY) and the bucket's (AWS_*), which no spec records."""


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
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    refiners: RefinersConfig = field(default_factory=RefinersConfig)
    matrix: MatrixConfig = field(default_factory=MatrixConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    results: str = "results"
    """Directory all outputs go under."""

    @property
    def world_size(self) -> int:
        return self.parallel.nodes * self.parallel.procs_per_node

    @property
    def train_world_size(self) -> int:
        """The ranks that train: all of them, or with rollout actors (the `actors` section) the first
        actors.train_ranks (or actors.train_nodes x procs_per_node); the others roll out."""
        a = self.actors
        return a.train_ranks or a.train_nodes * self.parallel.procs_per_node or self.world_size

    @property
    def has_actors(self) -> bool:
        """Whether some ranks are rollout actors (the `actors` section)."""
        return self.train_world_size < self.world_size

    @property
    def has_refiners(self) -> bool:
        """Whether prompt refiners rewrite the prompts and train with the generator (the `refiners` section)."""
        return bool(self.refiners.experts)

    @property
    def lora_base_dtype(self) -> str:
        """The frozen base's dtype under LoRA (train.lora_base_dtype resolved): the compute dtype, or float32."""
        return self.parallel.param_dtype if self.train.lora_base_dtype == "compute" else "float32"

    @property
    def gpus_per_node(self) -> int:
        """GPUs of one training node (what a cluster job asks for): one per process on cuda, none on cpu."""
        return self.parallel.procs_per_node if self.parallel.device == "cuda" else 0


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}
