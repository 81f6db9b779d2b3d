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
from pathlib import Path
from types import SimpleNamespace

import torch
from checkout import arguments, load_module, load_package, print_rows, read_source, relative_differences, store
from their_loop import Handed, flow_grpo_epoch
from trainer_side import one_batch, seeded_weights

REPO = Path(__file__).resolve().parents[2]
TRAIN_FILE = "scripts/train_sd3_fast.py"
PATCH_DIR = "flow_grpo/diffusers_patch"
PROMPTS, GROUP, STEPS, SHIFT, CALLS = 3, 4, 10, 3.0, 4
LATENT = (4, 3, 4, 4)  # [C, F, h, w]
SEED = 0
"""train.seed: batch 0's window starts at step 1, so the Euler step before it is in the comparison."""
EMA_EVERY = 2
"""The EMA's interval here (the preset's 8 would not blend within one step)."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""


def preset_config():
    """The tiny default with config/algorithms/flow_grpo_fast.yaml, one rank, 3 prompts x 4 members, the stand-in
    trained in full, the EMA every 2 updates."""
    from videogrpo import config

    cfg = config.load([REPO / "config/config.yaml", REPO / "config/algorithms/flow_grpo_fast.yaml"])
    cfg.grpo.prompts_per_step, cfg.grpo.group_size, cfg.grpo.sampling_steps = PROMPTS, GROUP, STEPS
    cfg.grpo.sample_batch_size, cfg.parallel.procs_per_node = None, 1
    cfg.train.lora_rank, cfg.train.ema_every, cfg.train.seed = 0, EMA_EVERY, SEED
    return cfg


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    found = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    found.set_timesteps(STEPS)
    return found


def inputs() -> dict:
    """Seeded weights and rewards (prompt 1's all alike), their scheduler's sigmas, and this project's draws for batch
    0: the window, each rollout's initial noise and its window steps' noise, and the rows of each optimizer update."""
    from videogrpo.grpo import assignment, minibatches, sde_window
    from videogrpo.grpo.advantages import group_advantages
    from videogrpo.grpo.draws import seeded_normal

    cfg = preset_config()
    g, seed = cfg.grpo, cfg.train.seed
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(PROMPTS, GROUP, generator=generator)
    rewards[1] = 0.5
    rows = minibatches.batch_rows(g)
    start, end = sde_window.window(g, seed, 0)
    kept = minibatches.kept_rows(
        g, seed, 0, group_advantages(rewards, g.advantage_std, g.advantage_std_unbiased, g.advantage_eps)
    )
    cpu = torch.device("cpu")
    return {
        "weights": seeded_weights(LATENT[0], generator),
        "rewards": rewards,
        "sigmas": scheduler().sigmas.clone(),
        "window": torch.tensor([start, end]),
        "initial_noise": torch.stack(
            [
                seeded_normal(LATENT, cpu, *assignment.init_noise_key(seed, 0, j, m, g.share_group_noise))
                for j, m in rows
            ]
        ),
        "step_noise": torch.stack(
            [
                torch.stack(
                    [
                        seeded_normal(LATENT, cpu, *assignment.step_noise_key(seed, 0, j, m, i))
                        for i in range(start, end)
                    ]
                )
                for j, m in rows
            ]
        ),
        "sets": torch.tensor([sorted(r) for _, r in minibatches.update_sets(g, seed, 0, kept)]),
    }


def authors_side(text: str, patch: dict, tracker, ema_module, data: dict) -> dict:
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

    patch["sd3_pipeline_with_logprob_fast"].random = SimpleNamespace(randint=randint)
    patch["sd3_sde_with_logprob"].randn_tensor = Handed(
        torch.stack(
            [data["step_noise"][position[r], i - start] if start <= i < end else torch.zeros(LATENT) for r in call]
        )
        for call in calls
        for i in range(STEPS)
    )
    config = SimpleNamespace(
        resolution=LATENT[-1],
        per_prompt_stat_tracking=True,
        sample=SimpleNamespace(
            num_batches_per_epoch=CALLS,
            train_batch_size=per_call,
            same_latent=g.share_group_noise,
            num_steps=STEPS,
            guidance_scale=g.guidance_scale,
            noise_level=g.eta,
            sde_window_size=g.sde_window_size,
            sde_window_range=(lo, hi),
            sde_type={"flowcps": "cps", "flowgrpo_sde": "sde"}[g.sampler],
            global_std=g.advantage_std == "batch",
        ),
        train=SimpleNamespace(
            cfg=False,
            beta=g.kl_coeff,
            adv_clip_max=5,
            clip_range=g.clip_range,
            num_inner_epochs=g.update_passes,
            max_grad_norm=cfg.train.max_grad_norm,
            ema=True,
        ),
    )
    theirs = flow_grpo_epoch(
        text,
        TRAIN_FILE,
        patch["sd3_pipeline_with_logprob_fast"].pipeline_with_logprob,
        patch["sd3_sde_with_logprob"].sde_step_with_logprob,
        SimpleNamespace(tracker=tracker, ema=ema_module),
        config,
        data["weights"],
        scheduler(),
        calls,
        [torch.stack([data["initial_noise"][position[r]] for r in call]) for call in calls],
        data["rewards"],
        cfg.train,
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
    cfg = preset_config()
    out = one_batch(cfg, data["weights"], data["sigmas"], data["rewards"], LATENT)
    start, end = data["window"].tolist()
    trained = {r for s in out["sets"] for r in s}
    rows = [(j, m) for j in range(PROMPTS) for m in range(GROUP)]
    return {
        "states": out["trajectory"][:, start : end + 1],
        "log_probs": out["log_probs"][:, start:end],
        "advantages": out["advantages"].flatten(),
        "kept": torch.tensor([float(r in trained) for r in rows]),
        "gradients": torch.stack(out["gradients"]),
        "trained": out["trained"],
        "ema": out["ema"],
    }


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "flow_grpo", argv)
    checkout = args.checkout.resolve()
    try:
        text, commit = read_source(checkout, args.commit, TRAIN_FILE)
        patch, _ = load_package(
            checkout,
            args.commit,
            PATCH_DIR,
            ["sd3_sde_with_logprob", "sd3_pipeline_with_logprob_fast"],
            "authors_diffusers_patch",
        )
        tracker, _ = load_module(checkout, args.commit, "flow_grpo/stat_tracking.py", "authors_stat_tracking")
        ema, _ = load_module(checkout, args.commit, "flow_grpo/ema.py", "authors_ema")
        data = inputs()
        theirs = authors_side(text, patch, tracker, ema, data)
    except (OSError, ImportError) as err:
        print(f"fast_step: could not run flow_grpo's code at {args.checkout}: {err}", file=sys.stderr)
        return 2
    print(f"flow_grpo at {commit}: one Flow-GRPO-Fast step of {PROMPTS} prompts x {GROUP}, their epoch's lines")
    ok = print_rows(compare(theirs, project_side(data)))
    store(args.store, {"commit": commit, "inputs": data, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
