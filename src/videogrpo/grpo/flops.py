"""Model FLOPs of the Wan transformer, per forward and per GRPO update, and the MFU they make.

Counted as `torch.utils.flop_counter` counts: every matmul (linear, the patch embedding's
convolution, attention's scores and values) as 2 m n k; norms, activations, RoPE, softmax, biases and
the sampler's elementwise arithmetic as nothing (they are a small fraction and not matmul work).
The backward is the forward's matmuls twice (the input's gradient and the weight's), less the input
gradient of the three matmuls whose input needs none (the patch embedding of the latents, the first
layers of the timestep and text embedders); gradient checkpointing (diffusers checkpoints each
block) recomputes the blocks' forward once more in the backward. Every parameter is trainable (full
fine-tuning, as the reference), unless LoRA trains adapters on a frozen base (train.lora_rank > 0).

Under LoRA each adapted linear layer (rows m, in k, out n) adds its adapters' matmuls, 2 m k r + 2 m r n, to the
forward (and to the recompute, for those inside the blocks). The backward has no weight gradient of a frozen
matmul, and no gradient at all where nothing before needs one: the embedders (their inputs and weights frozen),
the first block's self-attention q, k, v (their input is the embedded latents), the cross-attention's k, v (their
input is the text). It is: the input gradients of every other block matmul and of the output head, both operands'
gradients of attention's scores and values, and each adapter's gradients: A's weight gradient and B's weight and
input gradients, plus A's input gradient where its layer's input needs one. Exact (torch's counter agrees) when the
adapters wrap every attention projection, as the default train.lora_targets do; an upper bound otherwise.

Nothing here changes a training value, which is why this module is not part of the trainer's math
digest (`checkpoint.NOT_TRAINER_MATH`): the trainer makes one call per update (`update_metrics`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from videogrpo.grpo.sde_window import rollout_forwards, window


@dataclass(frozen=True)
class ForwardFlops:
    """FLOPs of one transformer forward of a batch, by part."""

    patch_embedding: int
    time_embedding: int
    text_embedding: int
    image_embedding: int
    blocks: int
    """All blocks: projections, attention scores and values, feed-forward."""
    attention: int
    """Of `blocks`: attention scores and values only (self-attention, cross-attention to text and image)."""
    output: int
    no_input_grad: int
    """Of the above: matmuls whose input needs no gradient, so their backward is the weight gradient only."""
    adapters: int = 0
    """LoRA's adapter matmuls (0: full fine-tuning), counted in `total`."""
    adapters_in_blocks: int = 0
    """Of `adapters`: those inside the blocks, which gradient checkpointing recomputes."""
    lora_backward: int | None = None
    """The backward under LoRA (the module docstring); None: full fine-tuning's."""

    @property
    def total(self) -> int:
        return (
            self.patch_embedding
            + self.time_embedding
            + self.text_embedding
            + self.image_embedding
            + self.blocks
            + self.output
            + self.adapters
        )

    @property
    def backward(self) -> int:
        if self.lora_backward is not None:
            return self.lora_backward
        return 2 * self.total - self.no_input_grad

    def training(self, gradient_checkpointing: bool) -> int:
        """Forward, backward and (with gradient checkpointing) the blocks' recompute."""
        recompute = self.blocks + self.adapters_in_blocks if gradient_checkpointing else 0
        return self.total + self.backward + recompute


def _get(config, name: str, default=None):
    # A mapping (a config.json's dict, or an entry of models/shapes.py) or a diffusers config object.
    return config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)


def video_tokens(latent_shape: tuple[int, ...], patch_size: tuple[int, int, int]) -> int:
    """Tokens of one sample: latent frames x (h / patch_h) x (w / patch_w) (latent shape [C, F, h, w])."""
    _, frames, height, width = latent_shape
    pt, ph, pw = patch_size
    return (frames // pt) * (height // ph) * (width // pw)


def forward_flops(
    config,
    video: int,
    text: int,
    batch: int = 1,
    per_token_timestep: bool = True,
    image: int = 0,
    lora_rank: int = 0,
    lora_targets: Sequence[str] = (),
) -> ForwardFlops:
    """FLOPs of one forward of diffusers' WanTransformer3DModel with `config` (its config or a dict of it).

    `video`: tokens per sample after patching; `text`: text tokens per sample (`model.max_text_tokens`,
    every one of them attended); `per_token_timestep`: the timestep embedded per token (Wan2.2 TI2V with
    expand_timesteps, as this project runs it) rather than once per sample; `image`: image-embedding
    tokens per sample (Wan2.1 I2V's CLIP tokens; this project passes none); `lora_rank` > 0: LoRA adapters of that
    rank on the linear layers `lora_targets` names (train.lora_targets), the base frozen.
    """
    d = _get(config, "num_attention_heads") * _get(config, "attention_head_dim")
    patch = math.prod(_get(config, "patch_size"))
    c_in = _get(config, "in_channels")
    c_out = _get(config, "out_channels") or c_in
    ffn, text_dim, freq = _get(config, "ffn_dim"), _get(config, "text_dim"), _get(config, "freq_dim")
    layers = _get(config, "num_layers")
    image_dim, added_kv = _get(config, "image_dim"), _get(config, "added_kv_proj_dim")
    if image and not (image_dim and added_kv):
        raise ValueError(f"{image} image tokens, but the config has image_dim {image_dim}, added_kv {added_kv}")

    def mm(rows: int, k: int, n: int) -> int:
        return 2 * batch * rows * k * n

    rows_t = video if per_token_timestep else 1
    first_time, first_text = mm(rows_t, freq, d), mm(text, text_dim, d)
    patch_embedding = mm(video, c_in * patch, d)
    time_embedding = first_time + mm(rows_t, d, d) + mm(rows_t, d, 6 * d)
    text_embedding = first_text + mm(text, d, d)
    image_embedding, first_image = 0, 0
    if image:  # WanImageEmbedding: a feed-forward image_dim -> image_dim -> d
        first_image = mm(image, image_dim, image_dim)
        image_embedding = first_image + mm(image, image_dim, d)
    self_attention = 2 * mm(video, video, d)  # scores Q K^T and values P V, over all heads
    cross_attention = 2 * mm(video, text, d) + (2 * mm(video, image, d) if image else 0)
    block = (
        4 * mm(video, d, d)  # self-attention q, k, v, out
        + 2 * mm(video, d, d)  # cross-attention q, out
        + 2 * mm(text, d, d)  # cross-attention k, v over the text tokens
        + (2 * mm(image, added_kv, d) if image else 0)
        + mm(video, d, ffn)
        + mm(video, ffn, d)
        + self_attention
        + cross_attention
    )
    full = ForwardFlops(
        patch_embedding=patch_embedding,
        time_embedding=time_embedding,
        text_embedding=text_embedding,
        image_embedding=image_embedding,
        blocks=layers * block,
        attention=layers * (self_attention + cross_attention),
        output=mm(video, d, c_out * patch),
        no_input_grad=patch_embedding + first_time + first_text + first_image,
    )
    if lora_rank <= 0:
        return full
    rows = {"video": video, "text": text, "image": image, "time": rows_t}
    in_block = [
        *((f"attn1.{p}", "video", d, d) for p in ("to_q", "to_k", "to_v", "to_out.0")),
        ("attn2.to_q", "video", d, d),
        ("attn2.to_k", "text", d, d),
        ("attn2.to_v", "text", d, d),
        ("attn2.to_out.0", "video", d, d),
        *(((f"attn2.{p}", "image", added_kv, d) for p in ("add_k_proj", "add_v_proj")) if image else ()),
        ("ffn.net.0.proj", "video", d, ffn),
        ("ffn.net.2", "video", ffn, d),
    ]
    outside = [
        ("condition_embedder.time_embedder.linear_1", "time", freq, d),
        ("condition_embedder.time_embedder.linear_2", "time", d, d),
        ("condition_embedder.time_proj", "time", d, 6 * d),
        ("condition_embedder.text_embedder.linear_1", "text", text_dim, d),
        ("condition_embedder.text_embedder.linear_2", "text", d, d),
        ("proj_out", "video", d, c_out * patch),
    ]

    def adapted(name: str) -> bool:  # peft's rule for a list of target names (grpo/lora.matches)
        return any(name == t or name.endswith("." + t) for t in lora_targets)

    def a_b(kind: str, k: int, n: int) -> tuple[int, int]:
        return mm(rows[kind], k, lora_rank), mm(rows[kind], lora_rank, n)

    # Input gradients of the base: every block matmul on the hidden stream (not the first block's q, k, v), the
    # output head, and attention's second operand.
    hidden = [(name, kind, k, n) for name, kind, k, n in in_block if kind == "video"]
    first_qkv = sum(mm(video, k, n) for name, _, k, n in hidden if name in ("attn1.to_q", "attn1.to_k", "attn1.to_v"))
    base_input = layers * sum(mm(video, k, n) for _, _, k, n in hidden) - first_qkv + full.output + 2 * full.attention
    in_blocks, outside_flops, adapter_backward = 0, 0, 0
    for where, (name, kind, k, n) in [("block", layer) for layer in in_block] + [("outside", o) for o in outside]:
        if not adapted(name):
            continue
        a, b = a_b(kind, k, n)
        copies = layers if where == "block" else 1
        # A's input gradient only where its layer's input needs one (not text, time or image, not block 0's q, k, v).
        needs = kind == "video"
        with_input = (copies - 1) if name in ("attn1.to_q", "attn1.to_k", "attn1.to_v") else copies
        adapter_backward += copies * (a + 2 * b) + (with_input * a if needs else 0)
        if where == "block":
            in_blocks += copies * (a + b)
        else:
            outside_flops += a + b
    return dataclasses.replace(
        full,
        adapters=in_blocks + outside_flops,
        adapters_in_blocks=in_blocks,
        lora_backward=base_input + adapter_backward,
    )


@dataclass(frozen=True)
class StepFlops:
    """Transformer FLOPs and token-forwards of one update's step, all ranks together."""

    train: int
    """Replay with gradients: forward, backward and recompute of every trained (timestep, sample)."""
    inference: int
    """Forwards without gradients: the rollout's sampling steps, the KL reference model's replay."""
    tokens: int
    """Video tokens through a transformer forward, every forward of the step counted."""


def step_flops(
    per_sample: ForwardFlops,
    tokens_per_sample: int,
    samples: int,
    trained_timesteps: int,
    sampling_steps: float,
    rolled_out: bool,
    guidance: bool,
    reference: bool,
    gradient_checkpointing: bool,
    old_policy: bool = False,
    passes: int = 1,
) -> StepFlops:
    """The trainer's transformer evaluations of one step: `samples` (prompts per step x group size) each
    replayed at `trained_timesteps` with gradients (and by the reference model without, when the KL weight
    is > 0), and, when the step rolled out a batch, denoised over `sampling_steps` forwards (fewer with a
    DPM-Solver tail: sde_window.rollout_forwards, or its mean over windows in the planner); classifier-free
    guidance doubles every evaluation (an unconditional forward beside the conditional one). `old_policy`: every
    replay also asks the old policy, without gradients (DiffusionNFT). `passes`: the replays over the batch
    (grpo.update_passes; however many updates a pass takes, it replays each row once). The padding forwards of
    uneven update sets under FSDP (grpo.minibatches) are no model FLOPs and not counted."""
    branches = 2 if guidance else 1
    replays = samples * trained_timesteps * branches * passes
    no_grad = replays * (int(reference) + int(old_policy)) + (samples * sampling_steps * branches if rolled_out else 0)
    return StepFlops(
        train=replays * per_sample.training(gradient_checkpointing),
        inference=no_grad * per_sample.total,
        tokens=(replays + no_grad) * tokens_per_sample,
    )


# Dense bf16 tensor-core peaks (no sparsity) by the name CUDA reports, with the SM count of the full
# chip: a MIG slice reports the same name with fewer SMs, and its peak is scaled by their share.
# Checked in order: a variant before the name it contains.
PEAK_BF16 = (
    (r"H100.*PCIe", 756e12, 114),
    (r"H100 NVL", 835e12, 132),
    (r"H100", 989e12, 132),
    (r"H200 NVL", 835e12, 132),
    (r"GH200", 989e12, 132),
    (r"H200", 989e12, 132),
    (r"H800", 989e12, 132),
    (r"B200", 2250e12, 148),
    (r"A100", 312e12, 108),
    (r"A800", 312e12, 108),
    (r"L40S", 362e12, 142),
    (r"\bL4\b", 121e12, 58),
)


def peak_bf16_flops(name: str, sm_count: int | None = None) -> float | None:
    """The device's dense bf16 peak in FLOP/s, None for a device not in PEAK_BF16 (no made-up number)."""
    for pattern, peak, full_sms in PEAK_BF16:
        if re.search(pattern, name):
            if sm_count is not None and 0 < sm_count < full_sms:
                return peak * sm_count / full_sms
            return peak
    return None


def device_peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of a CUDA device (None on CPU and on devices the table does not know)."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return peak_bf16_flops(props.name, props.multi_processor_count)


def update_metrics(trainer, metrics: dict, rolled_out: int | None) -> dict:
    """The speed fields of one update's metrics line (`trainer`: a grpo.trainer.Trainer after the update).

    FLOPs and tokens are of the step `time_step_s` measures: the replay of this update and, when `rolled_out` is a
    batch, the rollout this step prepared of it (a prefill's rollout belongs to no update).
    Wall-clock fields carry the `time_` prefix, which every comparison of metrics leaves out.
    """
    cfg, model = trainer.cfg, trainer.model
    config = next(iter(model.trainable.values())).config  # A14B's experts have one architecture
    tokens = video_tokens(trainer.shape, tuple(config.patch_size))
    step = step_flops(
        forward_flops(
            config, tokens, model.max_text_tokens, lora_rank=cfg.train.lora_rank, lora_targets=cfg.train.lora_targets
        ),
        tokens,
        cfg.grpo.prompts_per_step * cfg.grpo.group_size,
        metrics["trained_timesteps"],
        rollout_forwards(cfg.grpo, None if rolled_out is None else window(cfg.grpo, cfg.train.seed, rolled_out)),
        rolled_out is not None,
        cfg.grpo.guidance_scale > 1.0,
        trainer.experts.reference is not None,
        cfg.train.gradient_checkpointing,
        old_policy=cfg.grpo.algorithm == "nft",
        passes=cfg.grpo.update_passes,
    )
    seconds = metrics["time_step_s"]
    peak = device_peak_flops(trainer.ctx.device)
    mfu = None
    if peak is not None and seconds > 0:
        mfu = (step.train + step.inference) / (seconds * trainer.ctx.world_size * peak)
    return {
        "video_tokens_per_sample": tokens,
        "model_flops_per_update": step.train,
        "inference_flops_per_update": step.inference,
        "time_tokens_per_s": step.tokens / seconds if seconds > 0 else None,
        "time_mfu": mfu,
    }
