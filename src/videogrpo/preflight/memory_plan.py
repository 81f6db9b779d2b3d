"""The per-rank device memory a training run needs, planned from configs and safetensors headers.

Preflight prints this plan for the configured recipe and topology and refuses a run whose plan exceeds
the device (on `parallel.device: cpu` it is printed, never enforced). Nothing is loaded: parameter
counts come from the safetensors headers (artifacts/weights.py, which refuses a truncated or damaged file by
name), shapes from the components' config.json.

The terms, per rank (P: the trained transformers' parameters, both experts' for an I2V-A14B run training
both, while the working sets below count one expert's, since one runs at a time; shard = the sharding
degree x tensor_parallel, where the sharding degree is the data replicas (world size / tensor_parallel)
under `fsdp`, parallel.shard_group_size under `hsdp`, and 1 under `replicate` or on one rank; c, r, t, z:
bytes per element of the compute dtype (parallel.param_dtype), the reduce dtype, the trajectory dtype and
the frozen models' dtype):
- master weights 4 P / shard, gradients 4 P / shard, AdamW moments 8 P / shard (all float32; under LoRA, P of
  the gradients, the moments, FSDP's block gradients and the all-reduce buffer is the adapters' parameters, while
  the master weights are the frozen base's, in train.lora_base_dtype, and the adapters'; gradients
  exist only between the first backward and the optimizer step: replay phase only), counted parameter by
  parameter as torch shards them (parallel.shard_layout): FSDP pads dim 0 to a multiple of the sharding
  degree in the master weights and gradients, and TP leaves the parameters outside its plan whole;
- FSDP's unsharded working set: the root's own parameters (embedders, output head; FSDP2 keeps the
  root unsharded from forward to backward) in c, two blocks' parameters in c (the block running and
  the one prefetched) and one block's unsharded gradients in r, the blocks divided by tensor_parallel (TP splits
  nearly all of a block before FSDP gathers it); under `replicate` on more than one
  rank instead the flat all-reduce buffer of every gradient (4 P / tp, distributed.average_gradients)
  and, with a compute dtype other than float32, autocast's cached copies of the running expert's
  weights (c P / tp, P of one expert; autocast caches only weights that require gradients, so none under LoRA);
- frozen models: (text encoder + VAE parameters) x z, on the device in both phases unless
  train.offload_inference_models sends them to CPU before replay;
- activations of replay with gradient checkpointing, for B rows per forward (the rows of this rank's
  largest rollout chunk, which replay takes as the rollout did; x 2 under classifier-free guidance, whose
  unconditional graph is held too) at N video
  tokens per row (latent frames x (h / ph) x (w / pw), grpo.flops.video_tokens), hidden size d, FFN
  size f, L blocks:
      B N [ L c d                        every checkpointed block keeps its input hidden state
            + 2 x 4 d + 14 c d           outside the blocks: embeddings, the per-token timestep
                                         projection (6 d) and its MLP, the output head
            + 20 x 4 d + 6 c d + 2.5 c f ]  one block's recompute: what autograd saves inside a Wan
                                         block (its float32 modulation table and norms, q/k/v and the
                                         attention output, the FFN's hidden layer twice)
      + N x 2 x 4 x head_dim             RoPE's cos and sin tables (float32, shared by the rows)
  The coefficients are the counts of saved-for-backward tensors, measured on CPU with saved-tensor
  hooks (tests/test_memory_plan.py checks the formula against that count on three configs). With one
  timestep per row (the I2V-A14B) instead of per token (TI2V) the per-token float32 modulation tables and
  time projection do not exist: 13 x 4 d in the block and 5 c d outside. Tensor parallelism divides q, k, v,
  the attention output (4 of the block's 6 c d) and the FFN's hidden layer by its degree; the blocks' inputs
  stay whole (no sequence parallelism). They assume
  an attention kernel that keeps no N x N matrix (flash, memory-efficient, CPU SDPA); the math
  backends (`_native_math`) also keep heads x N^2 scores and probabilities in c, which is added. The
  gradients flowing through a block during its backward and the allocator's fragmentation are not
  counted: the measured peak on a GPU (tests/gpu) says how much they add.
- the rollout's working set (no gradients): the peak of one forward of the transformer for one row, counted with
  its own code on fake tensors at the run's latent shape (preflight/working_sets.py), times the rows of a rollout
  chunk (x 2 under classifier-free guidance; with a math attention backend its scores and probabilities too;
  under TP the whole block's transients, an upper bound). It is freed before the videos are decoded: the phase
  counts the larger of the two;
- trajectories held on the device: T + 1 latents per rollout in t, and the prompt embeddings of each
  row in c, for every row of this rank's batch, twice under delayed replay (the batch replayed and the
  batch rolled out before it is replayed); with trajectories offloaded only the replayed wave's;
- decoded videos (rollout phase): the VAE decodes grpo.decode_batch_size rows at a time (null: the wave);
  per video the larger of the decoder's own peak while it decodes (its working set and output, counted with the
  VAE's code on fake tensors: preflight/working_sets.py; in tiles with grpo.vae_tile_size) and what follows it,
  3 x frames x height x width elements held in z (the decoder's output), float32 (its copy), float32 (the
  clamp's result) and uint8;
- on CUDA a reserve of 1 GiB for the CUDA context, cuBLAS and NCCL workspaces.
With parallel.offload_optimizer the AdamW moments leave the device: they, a float32 copy of the master weights'
local shard and a gradient buffer of the same size (16 B per element of rank 0's unpadded shard) are host terms,
with the frozen models while train.offload_inference_models parks them on CPU; parallel.offload_gradients moves the
gradients there after the clipping norm, so the device still holds them through the backward passes (the
gradients term stays). Preflight checks procs_per_node x the host bytes per rank against the node's memory.
The peak is the largest of the phases' sums. For comparisons with measured runs, `plan` also takes a run's first
optimizer step (its AdamW moments only from the step on, a phase of their own), FSDP2 without a reduce-scatter until
an update's last backward (every gradient of an expert unsharded in the reduce dtype).
Against it stands the device's memory (a number in
parallel.device_memory_gib, or torch.cuda's total memory of device 0 probed on the node), less the
co-hosted judge's share (reward.judge_gpu_memory of each GPU, rl_5b_vlm with reward.judge_endpoint
empty: the training job starts the judge on the same GPUs).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from videogrpo.config import reward_kinds
from videogrpo.grpo.flops import video_tokens
from videogrpo.parallel import shard_layout
from videogrpo.preflight.model_shape import ModelShape, with_lora
from videogrpo.preflight.plan_terms import GIB, REPLAY, REPLAY_WORKING_SET, ROLLOUT, STEP, Term, gib
from videogrpo.preflight.working_sets import decoder_peak_bytes, forward_peak_bytes

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CUDA_RESERVE = 1 * GIB
"""CUDA context, cuBLAS and NCCL workspaces: outside the caching allocator, taken from the device all the same."""

# Saved-for-backward tensors per token and row, in units of d (or f) elements (see the module docstring).
OUTER_FLOAT32_D = 2
OUTER_COMPUTE_D = 14
BLOCK_FLOAT32_D = 20
BLOCK_COMPUTE_D = 6
BLOCK_COMPUTE_FFN = 2.5
# With one timestep per row (the I2V-A14B; TI2V embeds it per token) the per-token float32 modulation tables and the
# per-token time projection do not exist: measured as above on an I2V expert.
OUTER_FLOAT32_D_PER_ROW = 0
OUTER_COMPUTE_D_PER_ROW = 5
BLOCK_FLOAT32_D_PER_ROW = 13
# Of a block's compute-dtype d tensors, those tensor parallelism splits by its degree (q, k, v, attention output);
# its FFN hidden layer is split too. No sequence parallelism: the blocks' inputs are whole on every TP rank.
BLOCK_COMPUTE_D_TP_SPLIT = 4
MATH_BACKENDS = ("_native_math",)

SAMPLE_OR_DECODE = "rollout working set or decoded videos"


@dataclass
class MemoryPlan:
    terms: list[Term]
    device_bytes: int | None
    """The device's memory (None: unknown, on CPU or before probing)."""
    device_source: str
    judge_share: float = 0.0
    """Fraction of each GPU the co-hosted judge takes (0: no judge on these GPUs)."""
    enforced: bool = True
    facts: dict = field(default_factory=dict)
    host_terms: list[Term] = field(default_factory=list)
    """Bytes a rank holds in host memory by the plan (parallel.offload_optimizer; empty without it)."""

    @property
    def host_bytes(self) -> int:
        """A rank's planned host memory: every host term at once (the offloaded state lives through both phases)."""
        return sum(t.bytes for t in self.host_terms)

    def phase_total(self, phase: str) -> int:
        alone = sum(t.bytes for t in self.terms if phase in t.phases and not t.alternative)
        largest: dict[str, int] = {}
        for t in self.terms:
            if phase in t.phases and t.alternative:
                largest[t.alternative] = max(largest.get(t.alternative, 0), t.bytes)
        return alone + sum(largest.values())

    @property
    def phases(self) -> list[str]:
        return [phase for phase in (ROLLOUT, REPLAY, STEP) if any(phase in t.phases for t in self.terms)]

    @property
    def peak(self) -> int:
        return max(self.phase_total(phase) for phase in self.phases)

    @property
    def available(self) -> int | None:
        """Training's part of the device: all of it, less the co-hosted judge's share."""
        if self.device_bytes is None:
            return None
        return int(self.device_bytes * (1.0 - self.judge_share))

    @property
    def fits(self) -> bool:
        return self.available is None or self.peak <= self.available

    def lines(self) -> list[str]:
        out = [
            f"{t.name:<22} {gib(t.bytes):>10}  [{'+'.join(t.phases)}] {t.detail}"
            + (f" (not at once: {t.alternative}, the larger counts)" if t.alternative else "")
            for t in self.terms
        ]
        out += [f"{t.name:<22} {gib(t.bytes):>10}  [host] {t.detail}" for t in self.host_terms]
        if self.host_terms:
            out.append(f"{'host per rank':<22} {gib(self.host_bytes):>10}")
        out += [f"{phase + ' phase':<22} {gib(self.phase_total(phase)):>10}" for phase in self.phases]
        if self.device_bytes is None:
            out.append(f"{'peak':<22} {gib(self.peak):>10}  device memory unknown ({self.device_source})")
            return out
        judge = ""
        if self.judge_share:
            judge = f" less the judge's {self.judge_share:g} ({gib(self.device_bytes * self.judge_share)})"
        out.append(
            f"{'peak':<22} {gib(self.peak):>10}  of {gib(self.available)} available: "
            f"{gib(self.device_bytes)} ({self.device_source}){judge}"
        )
        return out

    def as_dict(self) -> dict:
        return {
            "terms": [asdict(t) for t in self.terms],
            "host_terms": [asdict(t) for t in self.host_terms],
            "host_bytes": self.host_bytes,
            "rollout_bytes": self.phase_total(ROLLOUT),
            "replay_bytes": self.phase_total(REPLAY),
            **({"step_bytes": self.phase_total(STEP)} if STEP in self.phases else {}),
            "peak_bytes": self.peak,
            "device_bytes": self.device_bytes,
            "device_source": self.device_source,
            "judge_share": self.judge_share,
            "available_bytes": self.available,
            "enforced": self.enforced,
            "fits": self.fits,
            **self.facts,
        }


def trained_transformers(kind: str, experts: str) -> tuple[str, ...]:
    """The transformer folders of the pipeline a run trains (model.kind, train.experts): TI2V's `transformer`, or
    the I2V-A14B experts train.experts names (`both`: `transformer` and `transformer_2`); an expert not trained
    is not loaded (docs/reference-system.md#a14b), so it takes no memory."""
    if kind != "i2v_a14b":
        return ("transformer",)
    from videogrpo.models.i2v import EXPERT_FOLDERS, EXPERTS

    return tuple(EXPERT_FOLDERS[name] for name in (EXPERTS if experts == "both" else (experts,)))


def rows_per_rank(cfg, world: int) -> tuple[int, int, int]:
    """(rows of this rank's largest wave, rows of its whole batch, rows of its largest rollout chunk: the
    wave's prompts x grpo.sample_batch_size members), the largest over all ranks."""
    from videogrpo.grpo.assignment import waves
    from videogrpo.grpo.offload import rollout_chunks

    largest_wave, batch, chunk = 0, 0, 0
    for rank in range(world):
        rank_waves = waves(cfg, rank, world)
        largest_wave = max(largest_wave, max(len(w) for w in rank_waves))
        batch = max(batch, sum(len(w) for w in rank_waves))
        for wave in rank_waves:
            chunk = max(chunk, max(len(c) for c in rollout_chunks(wave, cfg.grpo.sample_batch_size)))
    return largest_wave, batch, chunk


def plan(
    shape: ModelShape,
    *,
    frames: int,
    height: int,
    width: int,
    text_tokens: int,
    sampling_steps: int,
    world: int,
    data_parallel: str,
    shard_group_size: int,
    tensor_parallel: int,
    rows_per_forward: int,
    rows_per_batch: int,
    rollout_rows_per_forward: int | None = None,
    decode_rows: int | None = None,
    compute_dtype: str,
    reduce_dtype: str,
    trajectory_dtype: str,
    frozen_dtype: str = "float32",
    guidance: bool = False,
    delayed_replay: bool = False,
    gradient_checkpointing: bool = True,
    offload_frozen: bool = False,
    offload_trajectories: bool = False,
    offload_optimizer: bool = False,
    offload_gradients: bool = False,
    attention_backend: str = "native",
    cuda: bool = True,
    device_bytes: int | None = None,
    device_source: str = "",
    judge_share: float = 0.0,
    per_token_timestep: bool = True,
    first_update: bool = False,
    gradient_sync_each_backward: bool = True,
    lora_base_dtype: str = "float32",
    vae_tile_size: int | None = None,
    transition_means: bool = False,
    weight_copies: tuple[str, ...] = (),
) -> MemoryPlan:
    """The plan of one rank (the module docstring has the formula and its assumptions).

    `per_token_timestep`: the model embeds the timestep per token (TI2V) rather than per row (I2V). `first_update`:
    the first optimizer step of a fresh start, whose AdamW moments exist only from the step on (its own phase; the
    measurements docs/what-fits.md compares with were such). `gradient_sync_each_backward: false`: FSDP2 without
    a reduce-scatter until the last backward of an update keeps every gradient unsharded in the reduce dtype (the
    reference's setting of those measurements; this trainer reduce-scatters every backward). `lora_base_dtype`: the
    frozen base's dtype under LoRA (train.lora_base_dtype). `vae_tile_size`: grpo.vae_tile_size.
    `transition_means`: the rollouts keep every step's transition mean (grpo.grpo_guard). `weight_copies`: float32
    copies of the trained parameters' local shards, by name (`weight_copies_of`: DiffusionNFT's old policy, the
    moving average of the weights)."""
    config = shape.transformer
    c, r, t, z = BYTES[compute_dtype], BYTES[reduce_dtype], BYTES[trajectory_dtype], BYTES[frozen_dtype]
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    d, f, layers = heads * head_dim, config["ffn_dim"], config["num_layers"]
    latent = shape.latent_shape(frames, height, width)
    tokens = video_tokens(latent, tuple(config["patch_size"]))
    # FSDP shards over the data-parallel sub-mesh (world / tensor_parallel ranks), TP within each TP group.
    shard = shard_layout.sharding_degree(data_parallel, world // tensor_parallel, shard_group_size) * tensor_parallel
    p = shape.params
    # The optimizer state is every trained expert's; working sets are one expert's (one runs at a time).
    trained, trainable = shape.trained, shape.trainable
    experts = f" ({len(shape.experts)} experts)" if shape.experts else ""
    lora = " LoRA adapters" if shape.adapters else ""
    # Held from before the rollout to after the optimizer step; a first update's step is a phase of its own.
    both = (ROLLOUT, REPLAY, STEP) if first_update else (ROLLOUT, REPLAY)
    replay_only = (REPLAY, STEP) if first_update else (REPLAY,)
    # Rank 0 holds the largest share (FSDP's first shards are the full ones); every rank allocates the padded one.
    state = shard_layout.sharded_state_bytes(
        shape, shard_layout.rank_layout(data_parallel, world, shard_group_size, tensor_parallel, 0)
    )
    split = f"split {shard} ways, FSDP's padded shards"
    if shape.adapters and lora_base_dtype != "float32":  # the frozen base in its own dtype, the adapters in float32
        adapters = state["gradients"] // 4
        state["master weights"] = (state["master weights"] // 4 - adapters) * BYTES[lora_base_dtype] + 4 * adapters
        split += f", the frozen base in {lora_base_dtype}"
    moments = Term(
        "AdamW moments",
        state["AdamW moments"],
        (STEP,) if first_update else both,
        f"2 x 4 B float32 x {trainable:,}{lora}{experts}, rank 0's shard"
        + (": made by the first optimizer step" if first_update else ""),
    )
    gradients_detail = f"4 B float32 x {trainable:,}{lora}{experts}, {split}"
    if offload_gradients:
        gradients_detail += ": on the device through the backward passes, on the host for the optimizer step"
    terms = [
        Term(
            "master weights", state["master weights"], both, f"{trained:,} parameters{experts} x 4 B float32, {split}"
        ),
        *(() if offload_optimizer else (moments,)),
        # Without a reduce-scatter per backward, the sharded gradients are made by the last one, which frees the
        # unsharded ones ("unsynced gradients" below).
        Term(
            "gradients", state["gradients"], replay_only if gradient_sync_each_backward else (STEP,), gradients_detail
        ),
    ]
    for name in weight_copies:  # grpo/weight_copy.WeightCopy: a clone of each trained parameter's unpadded local shard
        held = state["weight copy"] // 4
        terms.append(Term(name, 4 * held, both, f"4 B float32 x {held:,}: {COPIES[name]}"))
    host_terms = []
    if offload_optimizer:  # grpo/host_optimizer.py: every host tensor is shaped like the unpadded local shard
        held = state["AdamW moments"] // 8  # elements of rank 0's unpadded local shards
        host_terms = [
            Term("AdamW moments", 8 * held, both, f"2 x 4 B float32 x {held:,} elements of rank 0's shard"),
            Term("master weights copy", 4 * held, both, f"4 B float32 x {held:,}: what AdamW steps on the host"),
            Term("gradients", 4 * held, both, f"4 B float32 x {held:,}: where the optimizer step reads them"),
        ]
        if offload_frozen:
            host_terms.append(
                Term("frozen models", shape.frozen_params * z, (REPLAY,), "text encoder + VAE, on CPU during replay")
            )
    # A block's parameters FSDP gathers: its weights and (LoRA) its adapters; TP has split nearly all of a block
    # (its attention and FFN projections) before FSDP gathers it.
    tp = f" / tensor_parallel {tensor_parallel}" if tensor_parallel > 1 else ""
    block_params = (p.per_block + (shape.trainable_per_block if shape.adapters else 0)) // tensor_parallel
    block_grads = shape.trainable_per_block // tensor_parallel
    if shard // tensor_parallel > 1:
        terms.append(
            Term(
                "FSDP unsharded",
                p.outside_blocks * c + 2 * block_params * c,
                (ROLLOUT, REPLAY),
                f"root {p.outside_blocks:,} + 2 blocks x {block_params:,} parameters{tp} x {c} B",
            )
        )
        terms.append(
            Term(
                "FSDP block gradients",
                block_grads * r,
                (REPLAY,),
                f"one block unsharded{tp} x {r} B" + (f" ({block_grads:,}{lora})" if lora else ""),
            )
        )
        if not gradient_sync_each_backward:
            expert = shape.trainable // len(shape.trained_counts)  # one expert's: they run one at a time
            terms.append(
                Term(
                    "unsynced gradients",
                    r * expert // tensor_parallel,
                    (REPLAY,),
                    f"every gradient of one expert unsharded{tp} x {r} B: no reduce-scatter until the last backward",
                )
            )
    elif world > 1:
        terms.append(
            Term("all-reduce buffer", 4 * trainable // tensor_parallel, replay_only, "every gradient, one flat buffer")
        )
    # Autocast caches the casts of weights that require gradients: under LoRA the frozen base is cast anew per use.
    if shard // tensor_parallel == 1 and c != 4 and not shape.adapters:
        terms.append(Term("autocast copies", c * p.total // tensor_parallel, both, f"weights cast to {c} B"))
    frozen = shape.frozen_params * z
    terms.append(
        Term(
            "frozen models",
            frozen,
            (ROLLOUT,) if offload_frozen else both,
            f"text encoder + VAE {shape.frozen_params:,} parameters x {z} B"
            + (" (on CPU during replay)" if offload_frozen else ""),
        )
    )
    if per_token_timestep:
        outer = OUTER_FLOAT32_D * 4 * d + OUTER_COMPUTE_D * c * d
        block_f32 = BLOCK_FLOAT32_D
    else:
        outer = OUTER_FLOAT32_D_PER_ROW * 4 * d + OUTER_COMPUTE_D_PER_ROW * c * d
        block_f32 = BLOCK_FLOAT32_D_PER_ROW
    split_d = BLOCK_COMPUTE_D_TP_SPLIT / tensor_parallel + (BLOCK_COMPUTE_D - BLOCK_COMPUTE_D_TP_SPLIT)
    block = block_f32 * 4 * d + split_d * c * d + BLOCK_COMPUTE_FFN * c * f / tensor_parallel
    math_attention = 2 * heads * tokens * c if attention_backend in MATH_BACKENDS else 0  # per token of N
    branches = 2 if guidance else 1
    # Rollout and replay forwards both take one chunk of grpo.sample_batch_size members per prompt.
    rows = (rollout_rows_per_forward or rows_per_forward) * branches
    per_block = block + math_attention
    # Checkpointed: each block's input, plus one block recomputed at a time; else every block's saved tensors.
    kept = layers * c * d + per_block if gradient_checkpointing else layers * per_block
    rope = tokens * 2 * 4 * head_dim  # RoPE's float32 cos and sin tables, shared by the rows
    activations = int(rows * tokens * (kept + outer)) + rope
    terms.append(
        Term(
            "activations",
            activations,
            (REPLAY,),
            f"{rows} rows x {tokens:,} tokens, {layers} blocks "
            + ("checkpointed, one recomputed" if gradient_checkpointing else "all kept (no checkpointing)"),
            alternative=REPLAY_WORKING_SET,  # a prompt refiner's replay comes after the generator's
        )
    )
    working = rollout_working_set(config, latent, text_tokens, compute_dtype, per_token_timestep, rows, math_attention)
    terms.append(working)
    per_row = rollout_record_bytes(config, latent, sampling_steps, text_tokens, t, c, transition_means)
    held = (
        (rollout_rows_per_forward or rows_per_forward)
        if offload_trajectories
        else rows_per_batch * (2 if delayed_replay else 1)
    )
    terms.append(
        Term(
            "trajectories",
            held * per_row,
            both,
            f"{held} rollouts x ({sampling_steps} + 1) latents {list(latent)} x {t} B + prompt embeddings"
            + (f" + {sampling_steps} transition means x 4 B (GRPO-Guard)" if transition_means else "")
            + (" (the others on CPU)" if offload_trajectories else ""),
        )
    )
    videos = rows_per_forward if decode_rows is None else decode_rows  # 0: a reward that decodes nothing
    terms += decoded_videos(shape, videos, frames, height, width, frozen_dtype, vae_tile_size)
    if cuda:
        terms.append(Term("CUDA reserve", CUDA_RESERVE, both, "context, cuBLAS and NCCL workspaces"))
    return MemoryPlan(
        terms,
        device_bytes,
        device_source,
        judge_share,
        enforced=cuda,
        facts={"video_tokens": tokens, "latent_shape": list(latent), "sharding": shard, "rows_per_forward": rows},
        host_terms=host_terms,
    )


def rollout_working_set(
    config: dict, latent, text_tokens: int, compute_dtype: str, per_token_timestep: bool, rows: int, math_attention
) -> Term:
    """The rollout's working set: one forward without gradients per row, counted with the transformer's code at the
    run's latent shape (an upper bound under TP, which splits a block's transients), times the rows of a chunk."""
    tokens = video_tokens(latent, tuple(config["patch_size"]))
    forward = forward_peak_bytes(config, latent, text_tokens, compute_dtype, per_token_timestep)
    forward += int(tokens * math_attention)
    return Term(
        "rollout working set",
        rows * forward,
        (ROLLOUT,),
        f"{rows} rows x {forward / GIB:.2f} GiB, a forward without gradients at {tokens:,} tokens (counted: "
        "preflight/working_sets.py)",
        alternative=SAMPLE_OR_DECODE,
    )


def rollout_record_bytes(
    config: dict, latent, steps: int, text_tokens: int, t: int, c: int, transition_means: bool
) -> int:
    """What one rollout's record holds until it is replayed: its steps + 1 latents in the trajectory dtype (t B), its
    prompt embeddings (c B) and, with GRPO-Guard, every step's transition mean in float32."""
    per_row = (steps + 1) * math.prod(latent) * t + text_tokens * config["text_dim"] * c
    return per_row + (steps * math.prod(latent) * 4 if transition_means else 0)


def decoded_videos(
    shape: ModelShape, videos: int, frames: int, height: int, width: int, frozen_dtype: str, vae_tile_size
) -> list[Term]:
    """The decoding's term (rollout phase; none for a reward that decodes nothing): per video of a decode batch the
    larger of the VAE's own peak while it decodes (its output included) and, after, the output, its float32 copy, the
    clamp's and the uint8 frames."""
    if not videos:
        return []
    z = BYTES[frozen_dtype]
    pixels = 3 * frames * height * width
    after = pixels * (z + 4 + 4 + 1)
    tiles = f"in {vae_tile_size}-pixel tiles" if vae_tile_size else "whole frames"
    if shape.vae:
        decoder = decoder_peak_bytes(shape.vae, frames, height, width, frozen_dtype, vae_tile_size)
        how = f"the decoder's peak ({tiles}, counted: preflight/working_sets.py) {decoder / GIB:.2f} GiB"
    else:
        decoder, how = 0, "the decoder's peak not counted (no VAE config)"
    return [
        Term(
            "decoded videos",
            videos * max(decoder, after),
            (ROLLOUT,),
            f"{videos} videos x the larger of {how} and 3 x {frames}x{height}x{width} x ({z} + 4 + 4 + 1) B "
            f"{after / GIB:.2f} GiB (its output, the float32 copy, the clamp's, the uint8 frames)",
            alternative=SAMPLE_OR_DECODE,
        )
    ]


def judge_share(cfg) -> float:
    """The share of each GPU the training job's own judge takes (0 when no judge runs on these GPUs)."""
    r = cfg.reward
    if "vbvr_vlm" not in reward_kinds(cfg) or r.judge_endpoint or cfg.parallel.device != "cuda":
        return 0.0
    return float(r.judge_gpu_memory)


def device_memory(cfg, probe=None) -> tuple[int | None, str]:
    """The device's memory in bytes and where the number comes from: parallel.device_memory_gib, else the
    total memory of CUDA device 0 probed here (`probe`: a stand-in for torch.cuda in tests)."""
    if cfg.parallel.device != "cuda":
        return None, "parallel.device cpu: printed, not enforced"
    if cfg.parallel.device_memory_gib is not None:
        return int(cfg.parallel.device_memory_gib * GIB), "parallel.device_memory_gib"
    if probe is None:
        import torch

        probe = torch.cuda
    if not probe.is_available():
        return None, "no CUDA device here to probe"
    props = probe.get_device_properties(0)
    return int(props.total_memory), f"probed: {props.name}"


def plan_for_config(cfg, shape: ModelShape, frozen_dtype: str | None = None, probe=None, **given) -> MemoryPlan:
    """The plan of a config's recipe and topology; `frozen_dtype` overrides model.frozen_dtype (the text
    encoder's and VAE's dtype), and `given` any other argument of `plan` (a measured run's settings that no config
    field sets: docs/what-fits.md)."""
    from videogrpo.models.wan import DTYPES, trajectory_dtype

    world = cfg.train_world_size  # with rollout actors, the train ranks (their plan: actor_plan)
    wave, batch, chunk = rows_per_rank(cfg, world)
    traj = trajectory_dtype(cfg.grpo.trajectory_dtype, cfg.parallel.param_dtype)
    traj_name = next(name for name, dtype in DTYPES.items() if dtype == traj)
    memory, source = device_memory(cfg, probe)
    if cfg.train.lora_rank > 0:  # gradients and AdamW moments for the adapters only (docs/options.md#lora)
        shape = with_lora(shape, cfg.train.lora_rank, cfg.train.lora_targets)
    arguments = dict(
        frames=cfg.video.num_frames,
        height=cfg.video.height,
        width=cfg.video.width,
        text_tokens=cfg.model.max_text_tokens,
        sampling_steps=cfg.grpo.sampling_steps,
        world=world,
        data_parallel=cfg.parallel.data_parallel,
        shard_group_size=cfg.parallel.shard_group_size,
        tensor_parallel=cfg.parallel.tensor_parallel,
        rows_per_forward=wave,
        rows_per_batch=batch,
        rollout_rows_per_forward=chunk,
        decode_rows=min(cfg.grpo.decode_batch_size or wave, wave),
        compute_dtype=cfg.parallel.param_dtype,
        reduce_dtype=cfg.parallel.reduce_dtype,
        trajectory_dtype=traj_name,
        frozen_dtype=frozen_dtype or cfg.model.frozen_dtype,
        guidance=cfg.grpo.guidance_scale > 1.0,
        delayed_replay=cfg.grpo.delayed_replay,
        gradient_checkpointing=cfg.train.gradient_checkpointing,
        offload_frozen=cfg.train.offload_inference_models,
        offload_trajectories=cfg.train.offload_inference_models,
        offload_optimizer=cfg.parallel.offload_optimizer,
        offload_gradients=cfg.parallel.offload_gradients,
        attention_backend=cfg.parallel.attention_backend,
        cuda=cfg.parallel.device == "cuda",
        device_bytes=memory,
        device_source=source,
        judge_share=judge_share(cfg),
        per_token_timestep=cfg.model.kind != "i2v_a14b",
        vae_tile_size=cfg.grpo.vae_tile_size,
        lora_base_dtype=cfg.lora_base_dtype,
        transition_means=cfg.grpo.grpo_guard,
        weight_copies=weight_copies_of(cfg),
    )
    planned = plan(shape, **{**arguments, **given})
    if cfg.has_refiners:  # replicated on every rank (preflight/refiner_memory.py)
        from videogrpo.preflight import refiner_memory

        planned.terms += refiner_memory.terms(cfg, tuple(planned.phases))
    return planned


COPIES = {
    "old policy": "DiffusionNFT's old weights (grpo.algorithm nft)",
    "EMA": "the moving average of the weights (train.ema_decay)",
}
"""The weight copies a rank may hold beside the trained weights, by their term's name."""


def weight_copies_of(cfg) -> tuple[str, ...]:
    """The weight copies a run holds (`COPIES`)."""
    return tuple(
        name
        for name, on in (("old policy", cfg.grpo.algorithm == "nft"), ("EMA", cfg.train.ema_decay is not None))
        if on
    )
