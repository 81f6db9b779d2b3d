"""What both sides of the comparison share: the settings, the prompts, the run's shape, the deterministic
perturbation of the policy, and the way parameters and AdamW moments are snapshotted.

This module imports neither the project nor the reference: it runs in both environments.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

WORK = Path(os.environ.get("DIFF_WORK", "."))
"""The scratch folder of a comparison: the reference checkout and venv, the tiny models, the compared files."""

DEFAULTS = dict(
    kind="ti2v",
    sampler="dancegrpo",
    eta=None,
    eta_range=None,
    T=4,
    G=4,
    frames=9,
    height=64,
    width=64,
    L=16,
    seed=42,
    lr=1e-4,
    weight_decay=0.01,
    max_grad_norm=1.0,
    clip_range=1e-3,
    delayed_clip_range=1e-2,
    kl_coeff=0.004,
    fraction=0.6,
    perturb=0.0,
    shift=5.0,
    updates=1,
    warmup=0,
    delayed=False,
    batches=None,
    epochs=1,
    max_steps=0,
    world=1,
    fsdp=0,
    tp=1,
    save_steps=10_000,
)
"""Every setting of a comparison (the `inputs` step's flags; both sides read them from the inputs file).

kind: `ti2v` (the tiny TI2V model, one transformer) or `i2v_a14b` (the tiny two-expert I2V model);
eta_range: [lo, hi] draws one Flow-CPS eta per prompt (the reference's grpo_cps_noise_scale_range);
tp: the tensor-parallel degree (with fsdp=1; the data-parallel degree is world / tp)."""

FLOATS = ("eta", "lr", "weight_decay", "max_grad_norm", "clip_range", "delayed_clip_range", "kl_coeff", "fraction")
FLOATS += ("perturb", "shift")

PROMPTS = [
    "a red cube slides to the left",
    "a blue ball bounces twice",
    "two squares swap places",
    "a maze path lights up",
    "a green triangle rotates",
    "a line grows to the right",
    "a circle shrinks",
    "a star moves up",
    "three dots blink",
    "a door opens",
]

EXPERT_NAMES = ("transformer", "transformer_2")
"""Snapshot prefixes of the trainable transformers, as the Diffusers folders name them: TI2V's one transformer, or
A14B's high-noise (`transformer`) and low-noise (`transformer_2`) experts."""


def model_dir(settings: dict) -> Path:
    """The tiny model of a comparison's kind in the scratch folder."""
    return WORK / ("tiny_i2v" if settings["kind"] == "i2v_a14b" else "tiny")


def plan_shape(s: dict) -> tuple[int, int, int | None]:
    """(batches per epoch, epochs, max_steps) of the run both sides are configured with: synchronous runs have
    `updates` batches and updates; delayed ones `batches` per epoch for `epochs`, capped at max_steps (0: none)."""
    if s["delayed"]:
        return s["batches"] or 4, s["epochs"], s["max_steps"] or None
    return s["updates"], 1, s["updates"]


def shared_prompts(s: dict) -> bool:
    """The reference's grpo_shared_prompt_batch (and the project's grpo.shared_prompts): delayed replay and more
    than one data-parallel rank need it; otherwise (one rank, or one tensor-parallel pair) both run their
    standard path."""
    return bool(s["delayed"] or s["world"] > s.get("tp", 1))


def perturb(module: torch.nn.Module, scale: float, seed: int) -> None:
    """Add the same deterministic offset on both sides, after the frozen KL reference was copied, so that KL is
    not 0 at update 1. Sharded (DTensor) parameters get their shard of the same full offset."""
    if scale <= 0:
        return
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            offset = scale * torch.randn(p.shape, generator=generator).to(p.dtype)
            if hasattr(p, "device_mesh"):
                from torch.distributed.tensor import distribute_tensor

                offset = distribute_tensor(offset, p.device_mesh, p.placements)
            p.add_(offset)


def perturb_seed(prefix: str) -> int:
    return 1234 + EXPERT_NAMES.index(prefix)


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().clone()


def params(modules: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Every parameter of the named transformers, gathered whole, keyed `prefix.name`."""
    return {f"{prefix}.{k}": full(v) for prefix, m in modules.items() for k, v in m.named_parameters()}


def adam_state(modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> tuple[dict, dict]:
    """AdamW's exp_avg and exp_avg_sq of every parameter that has them, keyed as `params`."""
    m1, m2 = {}, {}
    for prefix, module in modules.items():
        state = optimizers[prefix].state
        for k, p in module.named_parameters():
            st = state.get(p, {})
            if "exp_avg" in st:
                m1[f"{prefix}.{k}"], m2[f"{prefix}.{k}"] = full(st["exp_avg"]), full(st["exp_avg_sq"])
    return m1, m2


def rank_suffix(out: str | Path, rank: int) -> str:
    """Each rank writes its own side file: rank 0 OUT, rank r OUT.rankR."""
    return str(out) if rank == 0 else f"{out}.rank{rank}"
