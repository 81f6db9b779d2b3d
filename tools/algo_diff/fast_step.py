"""One whole training step of Flow-GRPO-Fast as config/algorithms/flow_grpo_fast.yaml runs it, against its authors'
own code (yifan123/flow_grpo) driving the same stand-in transformer (README.md beside this file).

    python tools/algo_diff/fast_step.py FLOW_GRPO [--commit C] [--store FILE]

FLOW_GRPO: a checkout of flow_grpo, its git directory (a clone or bare mirror), or a plain copy of its tree. One
step, 3 prompts x 4 members (one prompt's rewards all alike, so its 4 rollouts have advantage 0), 10 sampling steps
on their scheduler (FlowMatchEulerDiscreteScheduler, shift 3), the preset's every setting but two: LoRA (the
stand-in is trained in full, as their loop trains their adapter's parameters) and the EMA's interval, 2 instead of 8,
so that it blends within one step.

Their side runs their epoch as `scripts/train_sd3_fast.py` writes it, from `#### SAMPLING ####` to the EMA's step:
4 calls of their `pipeline_with_logprob` (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_fast.py, the SDE
window, their `cps` step inside it and noise level 0 outside) on a stand-in pipeline, the rewards, their
`PerPromptStatTracker` with the batch's std, the zero-advantage mask, the rebatching into 4 mini-batches, and per
mini-batch and window step their `compute_log_prob`, loss, backward, clip and AdamW step under accelerate's own
gradient accumulation (2 mini-batches x 3 steps an update), and `ema.step` (flow_grpo/ema.py) after each
mini-batch. This project's side is the trainer's own `prepare` and `update` (trainer_side.py).

Where the two draw differently by design (docs/fidelity.md), this project's draws are handed to their code: the
window's start (their `random.randint`), each rollout's initial noise (`prepare_latents`) and step noise
(`randn_tensor`), and which rollouts share an update (their sampling order: the rows of this project's first update,
then its second's, then the dropped rows, so that their contiguous mini-batches hold the same rows). Compared: the
window's states and log-probabilities of every rollout, the advantages, which rollouts are kept, the clipped gradient
of each optimizer update, and the trained weights and the EMA after the step.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from checkout import relative_differences, run_comparison
from their_loop import SD3_SHIFT, Handed, flow_grpo_epoch, load_flow_grpo, sd3_scheduler
from trainer_side import keyed_noise, one_batch, seeded_weights, update_rows
from trainer_side import preset_config as tiny_with

TRAIN_FILE = "scripts/train_sd3_fast.py"
PROMPTS, GROUP, STEPS, CALLS = 3, 4, 10, 4
LATENT = (4, 3, 4, 4)  # [C, F, h, w]
SEED = 0
"""train.seed: batch 0's window starts at step 1, so the Euler step before it is in the comparison."""
EMA_EVERY = 2
"""The EMA's interval here (the preset's 8 would not blend within one step)."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = f"one Flow-GRPO-Fast step of {PROMPTS} prompts x {GROUP}, {TRAIN_FILE}'s epoch"


def preset_config():
    """The tiny default with config/algorithms/flow_grpo_fast.yaml, one rank, 3 prompts x 4 members, the stand-in
    trained in full, the EMA every 2 updates."""
    return tiny_with(["config/algorithms/flow_grpo_fast.yaml"], PROMPTS, GROUP, STEPS, seed=SEED, ema_every=EMA_EVERY)


def inputs() -> dict:
    """Seeded weights and rewards (prompt 1's all alike), their scheduler's sigmas, and this project's draws for batch
    0: the window, each rollout's initial noise and its window steps' noise, and the rows of each optimizer update."""
    from videogrpo.grpo import sde_window

    cfg = preset_config()
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(PROMPTS, GROUP, generator=generator)
    rewards[1] = 0.5
    start, end = sde_window.window(cfg.grpo, cfg.train.seed, 0)
    return {
        "weights": seeded_weights(LATENT[0], generator),
        "rewards": rewards,
        "sigmas": sd3_scheduler(STEPS, SD3_SHIFT).sigmas.clone(),
        "window": torch.tensor([start, end]),
        **keyed_noise(cfg, 0, LATENT, range(start, end)),
        "sets": update_rows(cfg, 0, rewards),
    }


def load(checkout, commit: str):
    """What their epoch runs (their_loop.load_flow_grpo); the commit."""
    return load_flow_grpo(checkout, commit, TRAIN_FILE, "sd3_pipeline_with_logprob_fast")


def authors_side(loaded, data: dict) -> dict:
    """Their epoch, sampling to the EMA's step, on the stand-in with this project's draws handed in."""
    cfg = preset_config()
    g = cfg.grpo
    rows = [(j, m) for j in range(PROMPTS) for m in range(GROUP)]
    in_sets = [tuple(r) for s in data["sets"].tolist() for r in s]
    order = in_sets + [r for r in rows if r not in in_sets]  # their sampling order: each update's rows in turn
    per_call = len(rows) // CALLS
    calls = [order[k * per_call : (k + 1) * per_call] for k in range(CALLS)]
    start, end = data["window"].tolist()
    (lo, hi), position = g.sde_window_range, {r: n for n, r in enumerate(rows)}

    def randint(a: int, b: int) -> int:  # their window draw: this project's start, from the same range
        assert (a, b) == (lo, hi - g.sde_window_size), (a, b)
        return start

    loaded.pipeline.random = SimpleNamespace(randint=randint)
    loaded.step.randn_tensor = Handed(
        torch.stack(
            [data["step_noise"][position[r], i - start] if start <= i < end else torch.zeros(LATENT) for r in call]
        )
        for call in calls
        for i in range(STEPS)
    )
    theirs = flow_grpo_epoch(
        loaded,
        TRAIN_FILE,
        cfg,
        data["weights"],
        calls,
        [torch.stack([data["initial_noise"][position[r]] for r in call]) for call in calls],
        data["rewards"],
        CALLS // 2 * g.sde_window_size,  # their gradient accumulation: 2 mini-batches x the window's steps
        g.sde_window_size,
    )
    place = {r: (k, n) for k, call in enumerate(calls) for n, r in enumerate(call)}
    by_row = lambda per_call_values: torch.stack([per_call_values[place[r][0]][place[r][1]] for r in rows])  # noqa: E731
    mine = lambda values: torch.stack([values[order.index(r)] for r in rows])  # noqa: E731
    return {
        "states": by_row([torch.stack(latents, dim=1) for _, latents, _, _ in theirs["sampled"]]),
        "log_probs": by_row([torch.stack(logps, dim=1) for _, _, logps, _ in theirs["sampled"]]),
        "advantages": mine(theirs["advantages"]),
        "kept": mine(theirs["mask"]),
        "gradients": theirs["gradients"],
        "trained": theirs["trained"],
        "ema": theirs["ema"],
    }


def project_side(data: dict) -> dict:
    """The trainer's own prepare and update of batch 0 (trainer_side.one_batch) with the preset's values."""
    out = one_batch(preset_config(), data["weights"], data["sigmas"], data["rewards"], LATENT)
    start, end = data["window"].tolist()
    return {
        "states": out["trajectory"][:, start : end + 1],
        "log_probs": out["log_probs"][:, start:end],
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
