"""The memory plan of a rollout actor (the `actors` section, docs/options.md#rollout-actors): what an actor rank
holds, apart from a train rank (whose plan is memory_plan.plan_for_config at the train ranks' world). The terms reuse
memory_plan's counts of the rollout's working set and the decoding.

May import: `preflight.memory_plan`, `grpo` (assignment, offload, actors), `models` and the core modules.
"""

from __future__ import annotations

from videogrpo.grpo.flops import video_tokens
from videogrpo.preflight import memory_plan
from videogrpo.preflight.memory_plan import (
    BYTES,
    CUDA_RESERVE,
    MATH_BACKENDS,
    ROLLOUT,
    MemoryPlan,
    Term,
    decoded_videos,
    device_memory,
    judge_share,
    rollout_record_bytes,
    rollout_working_set,
    with_lora,
)


def actor_plan(cfg, shape: memory_plan.ModelShape, frozen_dtype: str | None = None, probe=None) -> MemoryPlan:
    """The plan of a rollout actor (the `actors` section): the policy whole and frozen in the compute dtype (LoRA:
    the base and its adapters), the frozen models, the rollout's working set for a chunk of its largest piece, two
    pieces' trajectories (one is sent while the next rolls out) and the decoding. No optimizer state, no gradients,
    no replay: one phase, the rollout."""
    from videogrpo.grpo import actors
    from videogrpo.grpo.offload import rollout_chunks
    from videogrpo.models.wan import DTYPES, trajectory_dtype

    if cfg.train.lora_rank > 0:
        shape = with_lora(shape, cfg.train.lora_rank, cfg.train.lora_targets)
    config = shape.transformer
    compute, frozen = cfg.parallel.param_dtype, frozen_dtype or cfg.model.frozen_dtype
    c, z = BYTES[compute], BYTES[frozen]
    traj = trajectory_dtype(cfg.grpo.trajectory_dtype, cfg.parallel.param_dtype)
    t = BYTES[next(name for name, dtype in DTYPES.items() if dtype == traj)]
    dealt = actors.pieces(cfg, cfg.train_world_size)
    piece = max(len(rows) for _, _, rows in dealt)
    chunk = max(len(c) for _, _, rows in dealt for c in rollout_chunks(rows, cfg.grpo.sample_batch_size))
    rows = chunk * (2 if cfg.grpo.guidance_scale > 1.0 else 1)
    latent = shape.latent_shape(cfg.video.num_frames, cfg.video.height, cfg.video.width)
    heads, tokens = config["num_attention_heads"], video_tokens(latent, tuple(config["patch_size"]))
    math_attention = 2 * heads * tokens * c if cfg.parallel.attention_backend in MATH_BACKENDS else 0
    weights = shape.params.total + (shape.trainable if shape.adapters else 0)
    steps = cfg.grpo.sampling_steps
    per_row = rollout_record_bytes(config, latent, steps, cfg.model.max_text_tokens, t, c, cfg.grpo.grpo_guard)
    phase = (ROLLOUT,)
    terms = [
        Term("policy", weights * c, phase, f"{weights:,} parameters whole and frozen x {c} B ({compute})"),
        Term("frozen models", shape.frozen_params * z, phase, f"text encoder + VAE {shape.frozen_params:,} x {z} B"),
        rollout_working_set(
            config, latent, cfg.model.max_text_tokens, compute, cfg.model.kind != "i2v_a14b", rows, math_attention
        ),  # fmt: skip
        Term("trajectories", 2 * piece * per_row, phase, f"2 pieces x {piece} rollouts x ({steps} + 1) latents"),
        *decoded_videos(
            shape,
            min(cfg.grpo.decode_batch_size or piece, piece),
            cfg.video.num_frames,
            cfg.video.height,
            cfg.video.width,
            frozen,
            cfg.grpo.vae_tile_size,
        ),  # fmt: skip
    ]
    cuda = cfg.parallel.device == "cuda"
    if cuda:
        terms.append(Term("CUDA reserve", CUDA_RESERVE, phase, "context, cuBLAS and NCCL workspaces"))
    memory, source = device_memory(cfg, probe)
    return MemoryPlan(
        terms, memory, source, judge_share(cfg), enforced=cuda, facts={"video_tokens": tokens, "piece_rows": piece}
    )
