"""The only GPU measurements of this training code (the reference trainer's authors', one optimizer step each) and
what this project's time model and memory plan give for the same runs: docs/what-fits.md prints the table,
tests/test_planner.py holds it to the code.

May import: `config`, `preflight.memory_plan`, `preflight.planner` and the core modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from videogrpo.preflight import memory_plan
from videogrpo.preflight.memory_plan import GIB
from videogrpo.preflight.planner import Assumptions, modelled_seconds, released_shape


@dataclass(frozen=True)
class Measured:
    """One optimizer step of the reference trainer as its authors measured it on GPUs (docs/what-fits.md)."""

    label: str
    recipe: str
    overrides: dict
    """What sets the recipe to the measured run's shape, layout and chunks."""
    step_s: float | None
    peak_gib: float
    """PyTorch's allocated peak."""
    plan_given: dict = field(default_factory=dict)
    """What the measured run did that no config field of this project sets (memory_plan.plan's arguments)."""


def _five(frames: int, side: int) -> dict:
    # 8 x H100, FSDP over 8, 4 prompts a step: two ranks per prompt, 16 samples a rank in two chunks of 8; the text
    # encoder and VAE stayed on the GPUs (the reference's 5B default then).
    return {
        "parallel": {"nodes": 1, "data_parallel": "fsdp", "device_memory_gib": 80},
        "grpo": {"prompts_per_step": 4, "sample_batch_size": 8},
        "video": {"num_frames": frames, "height": side, "width": side},
        "train": {"offload_inference_models": False},
    }


# Every measurement is the first optimizer step of a fresh (or weights-only) start, PyTorch's allocated bytes (no
# CUDA context or NCCL workspaces); the 5B runs skipped the gradient reduce-scatter until an update's last backward.
FIRST_STEP = {"first_update": True, "cuda": False}
UNSYNCED = {**FIRST_STEP, "gradient_sync_each_backward": False}


MEASURED = (
    Measured("TI2V-5B 256x256x161, 8 x H100, FSDP 8", "rl_5b_cps", _five(161, 256), 204.18, 46.8, UNSYNCED),
    Measured("TI2V-5B 256x256x81, 8 x H100, FSDP 8", "rl_5b_cps", _five(81, 256), 137.13, 40.6, UNSYNCED),
    Measured("TI2V-5B 384x384x81, 8 x H100, FSDP 8", "rl_5b_cps", _five(81, 384), 220.09, 48.7, UNSYNCED),
    Measured(
        "I2V-A14B 256x256x161, 8 x H100, TP 2 x FSDP 4",
        "rl_a14b_rule",
        {"parallel": {"device_memory_gib": 80}, "grpo": {"sample_batch_size": 1}},
        4496.43,
        59.4,
        FIRST_STEP,
    ),
    Measured(
        "TI2V-5B 512x512x81, 1 x H800, LoRA rank 16, G 2, T 2",
        "rl_5b_cps",
        {
            "parallel": {"nodes": 1, "procs_per_node": 1, "data_parallel": "replicate", "device_memory_gib": 80},
            "grpo": {"prompts_per_step": 1, "group_size": 2, "sampling_steps": 2},
            "train": {"lora_rank": 16},
        },
        None,
        22.6,
        # A reward that decodes no video (the base in bf16, as train.lora_base_dtype: compute gives).
        {**FIRST_STEP, "decode_rows": 0},
    ),
)


def against_measurements(load, assume: Assumptions | None = None) -> list[tuple[Measured, float | None, float]]:
    """(measurement, modelled seconds per update or None, planned peak GiB) for each of MEASURED; `load(recipe,
    overrides)` gives the config (config.load of the recipe's layers)."""
    assume = assume or Assumptions()
    out = []
    for m in MEASURED:
        cfg = load(m.recipe, m.overrides)
        shape = released_shape(cfg)
        seconds = sum(modelled_seconds(cfg, shape, assume).values()) if m.step_s is not None else None
        out.append((m, seconds, memory_plan.plan_for_config(cfg, shape, **m.plan_given).peak / GIB))
    return out


def measurement_row(measured: Measured, seconds: float | None, peak_gib: float) -> str:
    """A row of docs/what-fits.md's table: the model and the plan beside the measurement."""
    time = "- | - | -"
    if seconds is not None:
        time = f"{seconds:,.0f} s | {measured.step_s:,.0f} s | {seconds / measured.step_s:.2f}"
    memory = f"{peak_gib:.1f} GiB | {measured.peak_gib} GiB | {peak_gib / measured.peak_gib:.2f}"
    return f"| {measured.label} | {time} | {memory} |"
