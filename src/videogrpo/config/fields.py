"""Each config field's own rules (its choices, ranges and pins) and what a run's fields name (the reward kinds it
scores with, its EvalKit runtime): the facts the cross-field checks (`checks`, `option_rules`) build on.

May import: `config.sections` and the core modules.
"""

from __future__ import annotations

import re
from typing import Any

from videogrpo.config.sections import Config

HEX40 = re.compile(r"^[0-9a-f]{40}$")


HEX64 = re.compile(r"^[0-9a-f]{64}$")


CHOICES = {
    "model.source": ("hub", "tiny"),
    "model.kind": ("ti2v", "i2v_a14b"),
    "train.experts": ("both", "high", "low"),
    "data.source": ("hub", "synthetic"),
    "data.inflater": ("auto", "isal", "zlib"),
    "reward.kind": ("vbvr_rule", "vbvr_vlm"),
    "grpo.algorithm": ("grpo", "nft"),
    "grpo.sampler": ("flowcps", "dancegrpo", "flowgrpo", "flowgrpo_sde", "euler", "dpm_solver"),
    "grpo.trajectory_dtype": ("compute", "float32", "bfloat16"),
    "grpo.sde_window_mode": ("random", "sliding"),
    "grpo.sde_window_tail": ("euler", "dpm_solver"),
    "grpo.grpo_guard_scope": ("micro_batch", "row"),
    "grpo.update_order": ("shuffled", "by_member"),
    "actors.weight_sync": ("auto", "lora", "full", "none"),
    "grpo.advantage_std": ("group", "batch"),
    "train.lr_schedule": ("cosine", "constant"),
    "train.lora_base_dtype": ("compute", "float32"),
    "model.frozen_dtype": ("float32", "bfloat16", "float16"),
    "model.condition_dtype": ("bfloat16", "float32"),
    "matrix.split": ("heldout", "rl"),
    "parallel.data_parallel": ("replicate", "fsdp", "hsdp"),
    "parallel.device": ("cpu", "cuda"),
    "parallel.backend": ("gloo", "nccl"),
    "parallel.param_dtype": ("float32", "bfloat16", "float16"),
    "parallel.reduce_dtype": ("float32", "bfloat16"),
    "logging.wandb_mode": ("offline", "online", "disabled"),
}


POSITIVE = {
    "model.max_text_tokens",
    "actors.prefetch",
    "actors.sync_interval",
    "actors.stall_timeout_s",
    "grpo.updates_per_batch",
    "grpo.update_passes",
    "grpo.advantage_eps",
    "grpo.sde_window_stride",
    "grpo.nft_beta",
    "grpo.nft_adv_clip",
    "grpo.sde_window_shift_every",
    "train.divergence_points",
    "data.samples_per_task",
    "data.max_member_mb",
    "video.num_frames",
    "video.height",
    "video.width",
    "video.fps",
    "evalkit.workers",
    "evalkit.threads_per_worker",
    "evalkit.video_size",
    "evalkit.max_seconds",
    "matrix.max_seconds",
    "reward.judge_frames",
    "reward.judge_fps",
    "reward.judge_concurrency",
    "reward.judge_timeout_s",
    "reward.judge_tensor_parallel",
    "reward.judge_data_parallel",
    "reward.judge_max_model_len",
    "reward.judge_max_num_seqs",
    "reward.judge_ready_timeout_s",
    "grpo.sampling_steps",
    "grpo.shift",
    "grpo.clip_range_high",
    "grpo.group_size",
    "grpo.prompts_per_step",
    "grpo.prompts_per_wave",
    "grpo.sample_batch_size",
    "grpo.clip_range",
    "grpo.delayed_clip_range",
    "train.lr",
    "train.epochs",
    "train.max_steps",
    "train.batch_size",
    "train.keep_checkpoints",
    "train.max_grad_norm",
    "parallel.nodes",
    "parallel.procs_per_node",
    "parallel.shard_group_size",
    "parallel.tensor_parallel",
    "parallel.cpu_threads",
    "parallel.device_memory_gib",
    "matrix.expected_samples",
    "matrix.samples_per_task",
    "matrix.num_frames",
    "matrix.height",
    "matrix.width",
    "matrix.procs",
    "matrix.bootstrap",
}


NON_NEGATIVE = {
    "data.heldout_per_task",
    "actors.train_ranks",
    "actors.train_nodes",
    "train.save_steps",
    "grpo.eta",
    "grpo.kl_coeff",
    "grpo.guidance_scale",
    "train.warmup_steps",
    "train.weight_decay",
    "evalkit.crf",
    "model.tiny_seed",
    "model.prompt_cache_bytes",
    "grpo.decode_batch_size",
    "reward.judge_max_retries",
    "train.retries",
    "train.lora_rank",
    "train.lora_dropout",
    "grpo.nft_old_decay_rate",
    "grpo.nft_old_decay_after",
}


def _get(cfg: Config, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def field_problems(cfg: Config, sections: set[str]) -> list[str]:
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


def revision_problem(field: str, value: str) -> str | None:
    """Why `value` is no pinned commit: a lower-case 40-hex id (what the Hub's URLs and listings use)."""
    if HEX40.match(value):
        return None
    if HEX40.match(value.lower()):
        return f"{field} = {value!r}: must be a lower-case 40-hex commit id: write {value.lower()!r}"
    return f"{field} = {value!r}: must be a lower-case 40-hex commit id (branch and tag names move: refused)"


def runtime_contract(cfg: Config) -> dict[str, str]:
    """evalkit.runtime as {distribution name: version}."""
    return dict(pin.split("==", 1) for pin in cfg.evalkit.runtime)


def reward_kinds(cfg: Config) -> tuple[str, ...]:
    """The reward kinds a run scores with, whose runtimes it starts and checks: the training reward's
    (`training_reward_kinds`) and the gold rewards that score its validation points (train.validate_rewards)."""
    return kinds_in(cfg.reward.kind, cfg.reward.terms, cfg.train.validate_rewards)


def training_reward_kinds(cfg: Config) -> tuple[str, ...]:
    """The reward kinds the policy is trained on: reward.terms' kinds (several rewards), or reward.kind alone."""
    return kinds_in(cfg.reward.kind, cfg.reward.terms)


def kinds_in(kind: str, terms: dict[str, float] | None, gold: list[str] | None = None) -> tuple[str, ...]:
    """`reward_kinds` of the reward section's values and train.validate_rewards, as a stage recorded them in its
    params (no Config there)."""
    trained = tuple(sorted(terms)) if terms else (kind,)
    return trained + tuple(sorted(set(gold or ()) - set(trained)))
