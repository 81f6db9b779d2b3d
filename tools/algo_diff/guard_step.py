"""One whole training step of GRPO-Guard as config/algorithms/grpo_guard.yaml runs it, against its authors' own code
(yifan123/flow_grpo) driving the same stand-in transformer (README.md beside this file).

    python tools/algo_diff/guard_step.py FLOW_GRPO [--commit C] [--store FILE]

FLOW_GRPO: a checkout of flow_grpo, its git directory (a clone or bare mirror), or a plain copy of its tree. One
step, 3 prompts x 4 members (one prompt's rewards all alike, so its 4 rollouts have advantage 0 and are dropped), 10
sampling steps on their scheduler (FlowMatchEulerDiscreteScheduler, shift 3), the preset's every setting but LoRA
(the stand-in is trained in full, as their loop trains their adapter's parameters) and the EMA's cadence: every 2
updates instead of 8, so that it blends within one step, and 2 blends an update, their count at this step's shape
(2 micro-batches an update; the preset's 4 is their count at 16 GPUs). The seed is one whose two updates each take
2 rollouts of each kept prompt: this project's replay forwards (one per prompt of an update's rows, the scope of
GRPO-Guard's `micro_batch` mean-shift term) are then their micro-batches, whose scope their code takes
(docs/fidelity.md).

Their side runs their epoch as `scripts/train_sd3_GRPO_Guard.py` writes it, from `#### SAMPLING ####` to the EMA's
step: 4 calls of their `pipeline_with_logprob` (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py: their `sde`
step at noise level 0.7 on every step, classifier-free guidance at 4.5, the transition means kept) on a stand-in
pipeline, their stat tracker with each group's std, the zero-advantage mask, their shuffle and rebatching into 4
micro-batches, and per micro-batch and trained step (9 of 10) their `compute_log_prob`, the normalised ratio, the
loss divided by dt, the backward, the clip and the AdamW step under accelerate's own gradient accumulation (2
micro-batches x 9 steps an update), and `ema.step` after each micro-batch. This project's side is the trainer's own
`prepare` and `update` (trainer_side.py). The stand-in velocity does not read the prompt, so the guidance's two
branches are equal on both sides.

Handed to their code: each rollout's initial noise (`prepare_latents`) and step noise (`randn_tensor`), and their
shuffle (`torch.randperm`): this project's first update's rows, prompt by prompt, then its second's. Compared: every
rollout state, log-probability and transition mean, the advantages, which rollouts are kept, each update's clipped
gradient, and the trained weights and the EMA after the step.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys

import torch
from checkout import relative_differences, run_comparison
from their_loop import SD3_SHIFT, Handed, TorchWith, flow_grpo_epoch, load_flow_grpo, sd3_scheduler
from trainer_side import keyed_noise, one_batch, seeded_weights, update_rows
from trainer_side import preset_config as tiny_with

TRAIN_FILE = "scripts/train_sd3_GRPO_Guard.py"
PROMPTS, GROUP, STEPS, CALLS = 3, 4, 10, 4
LATENT = (4, 3, 4, 4)  # [C, F, h, w]
SEED = 1
"""train.seed: each of batch 0's two updates takes 2 rollouts of each kept prompt (inputs() checks it)."""
EMA_EVERY, EMA_REPEATS = 2, 2
"""The EMA's cadence here: blends within one step, 2 an update as their loop at 2 micro-batches an update."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = f"one GRPO-Guard step of {PROMPTS} prompts x {GROUP}, {TRAIN_FILE}'s epoch"


def preset_config():
    """The tiny default with config/algorithms/grpo_guard.yaml, one rank, 3 prompts x 4 members, the stand-in
    trained in full, the EMA's cadence of this step's shape."""
    return tiny_with(
        ["config/algorithms/grpo_guard.yaml"], PROMPTS, GROUP, STEPS, seed=SEED, ema_every=EMA_EVERY,
        ema_repeats=EMA_REPEATS,
    )  # fmt: skip


def inputs() -> dict:
    """Seeded weights and rewards (prompt 1's all alike), their scheduler's sigmas, and this project's draws for batch
    0: each rollout's initial noise and step noise, and the rows of each optimizer update."""
    cfg = preset_config()
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(PROMPTS, GROUP, generator=generator)
    rewards[1] = 0.5
    sets = update_rows(cfg, 0, rewards)
    kept = {j for j, _ in sets.flatten(0, 1).tolist()}
    if {int((s[:, 0] == j).sum()) for s in sets for j in kept} != {sets.shape[1] // len(kept)}:
        raise OSError(f"seed {SEED}: the updates' rows {sets.tolist()} do not split evenly by prompt; pick another")
    return {
        "weights": seeded_weights(LATENT[0], generator),
        "rewards": rewards,
        "sigmas": sd3_scheduler(STEPS, SD3_SHIFT).sigmas.clone(),
        **keyed_noise(cfg, 0, LATENT, range(STEPS)),
        "sets": sets,
    }


def load(checkout, commit: str):
    """What their epoch runs (their_loop.load_flow_grpo); the commit."""
    return load_flow_grpo(checkout, commit, TRAIN_FILE, "sd3_pipeline_with_logprob")


def authors_side(loaded, data: dict) -> dict:
    """Their epoch, sampling to the EMA's step, on the stand-in with this project's draws handed in."""
    cfg = preset_config()
    rows = [(j, m) for j in range(PROMPTS) for m in range(GROUP)]
    per_call = len(rows) // CALLS
    calls = [rows[k * per_call : (k + 1) * per_call] for k in range(CALLS)]  # sampled in order
    loaded.step.randn_tensor = Handed(
        torch.stack([data["step_noise"][rows.index(r), i] for r in call]) for call in calls for i in range(STEPS)
    )
    kept = [tuple(r) for s in data["sets"].tolist() for r in s]
    by_prompt = [
        r for s in data["sets"].tolist() for j in sorted({r[0] for r in s}) for r in map(tuple, s) if r[0] == j
    ]
    order = sorted(kept)  # their kept rows, as the mask leaves them; shuffled into this project's forwards
    shuffle = torch.tensor([order.index(r) for r in by_prompt])
    trained = int(STEPS * 0.99)  # their timestep_fraction 0.99: every step but the last
    theirs = flow_grpo_epoch(
        loaded,
        TRAIN_FILE,
        cfg,
        data["weights"],
        calls,
        [torch.stack([data["initial_noise"][rows.index(r)] for r in call]) for call in calls],
        data["rewards"],
        CALLS // 2 * trained,  # their gradient accumulation: 2 micro-batches x the trained steps
        trained,
        TorchWith(randperm=Handed([shuffle])),
    )
    sampled = lambda part: torch.cat([torch.stack(out[part], dim=1) for out in theirs["sampled"]])  # noqa: E731
    return {
        "states": sampled(1),
        "log_probs": sampled(2),
        "means": sampled(3),
        "advantages": theirs["advantages"],
        "kept": theirs["mask"],
        "gradients": theirs["gradients"],
        "trained": theirs["trained"],
        "ema": theirs["ema"],
    }


def project_side(data: dict) -> dict:
    """The trainer's own prepare and update of batch 0 (trainer_side.one_batch) with the preset's values."""
    out = one_batch(preset_config(), data["weights"], data["sigmas"], data["rewards"], LATENT)
    return {
        "states": out["trajectory"],
        "log_probs": out["log_probs"],
        "means": out["means"],
        "advantages": out["advantages"].flatten(),
        "kept": out["kept"],
        "gradients": torch.stack(out["gradients"]),
        "trained": out["trained"],
        "ema": out["ema"],
    }


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    return run_comparison(__doc__, "flow_grpo", argv, sys.modules[__name__], load)


if __name__ == "__main__":
    sys.exit(main())
