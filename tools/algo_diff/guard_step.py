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
from pathlib import Path
from types import SimpleNamespace

import torch
from checkout import arguments, load_module, load_package, print_rows, read_source, relative_differences, store
from their_loop import Handed, TorchWith, flow_grpo_epoch
from trainer_side import one_batch, seeded_weights

REPO = Path(__file__).resolve().parents[2]
TRAIN_FILE = "scripts/train_sd3_GRPO_Guard.py"
PATCH_DIR = "flow_grpo/diffusers_patch"
PROMPTS, GROUP, STEPS, SHIFT, CALLS = 3, 4, 10, 3.0, 4
LATENT = (4, 3, 4, 4)  # [C, F, h, w]
SEED = 1
"""train.seed: each of batch 0's two updates takes 2 rollouts of each kept prompt (inputs() checks it)."""
EMA_EVERY, EMA_REPEATS = 2, 2
"""The EMA's cadence here: blends within one step, 2 an update as their loop at 2 micro-batches an update."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""


def preset_config():
    """The tiny default with config/algorithms/grpo_guard.yaml, one rank, 3 prompts x 4 members, the stand-in
    trained in full, the EMA's cadence of this step's shape."""
    from videogrpo import config

    cfg = config.load([REPO / "config/config.yaml", REPO / "config/algorithms/grpo_guard.yaml"])
    cfg.grpo.prompts_per_step, cfg.grpo.group_size, cfg.grpo.sampling_steps = PROMPTS, GROUP, STEPS
    cfg.grpo.sample_batch_size, cfg.parallel.procs_per_node = None, 1
    cfg.train.lora_rank, cfg.train.seed = 0, SEED
    cfg.train.ema_every, cfg.train.ema_repeats = EMA_EVERY, EMA_REPEATS
    return cfg


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    found = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    found.set_timesteps(STEPS)
    return found


def inputs() -> dict:
    """Seeded weights and rewards (prompt 1's all alike), their scheduler's sigmas, and this project's draws for batch
    0: each rollout's initial noise and step noise, and the rows of each optimizer update."""
    from videogrpo.grpo import assignment, minibatches
    from videogrpo.grpo.advantages import group_advantages
    from videogrpo.grpo.draws import seeded_normal

    cfg = preset_config()
    g, seed = cfg.grpo, cfg.train.seed
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(PROMPTS, GROUP, generator=generator)
    rewards[1] = 0.5
    rows = minibatches.batch_rows(g)
    kept = minibatches.kept_rows(
        g, seed, 0, group_advantages(rewards, g.advantage_std, g.advantage_std_unbiased, g.advantage_eps)
    )
    sets = [sorted(r) for _, r in minibatches.update_sets(g, seed, 0, kept)]
    halves = {sum(1 for j, _ in s if j == prompt) for s in sets for prompt in {j for j, _ in kept}}
    if halves != {len(sets[0]) // 2}:
        raise OSError(f"seed {seed}: the updates' rows {sets} do not split evenly by prompt; pick another SEED")
    cpu = torch.device("cpu")
    return {
        "weights": seeded_weights(LATENT[0], generator),
        "rewards": rewards,
        "sigmas": scheduler().sigmas.clone(),
        "initial_noise": torch.stack(
            [
                seeded_normal(LATENT, cpu, *assignment.init_noise_key(seed, 0, j, m, g.share_group_noise))
                for j, m in rows
            ]
        ),
        "step_noise": torch.stack(
            [
                torch.stack(
                    [seeded_normal(LATENT, cpu, *assignment.step_noise_key(seed, 0, j, m, i)) for i in range(STEPS)]
                )
                for j, m in rows
            ]
        ),
        "sets": torch.tensor(sets),
    }


def authors_side(text: str, patch: dict, tracker, ema_module, data: dict) -> dict:
    """Their epoch, sampling to the EMA's step, on the stand-in with this project's draws handed in."""
    cfg = preset_config()
    g = cfg.grpo
    rows = [(j, m) for j in range(PROMPTS) for m in range(GROUP)]
    per_call = len(rows) // CALLS
    calls = [rows[k * per_call : (k + 1) * per_call] for k in range(CALLS)]  # sampled in order
    patch["sd3_sde_with_logprob"].randn_tensor = Handed(
        torch.stack([data["step_noise"][rows.index(r), i] for r in call]) for call in calls for i in range(STEPS)
    )
    kept = [tuple(r) for s in data["sets"].tolist() for r in s]
    by_prompt = [
        r for s in data["sets"].tolist() for j in sorted({r[0] for r in s}) for r in map(tuple, s) if r[0] == j
    ]
    order = sorted(kept)  # their kept rows, as the mask leaves them; shuffled into this project's forwards
    shuffle = torch.tensor([order.index(r) for r in by_prompt])
    trained = int(STEPS * 0.99)  # their timestep_fraction 0.99: every step but the last
    config = SimpleNamespace(
        resolution=LATENT[-1],
        per_prompt_stat_tracking=True,
        rationorm=g.grpo_guard,
        sample=SimpleNamespace(
            num_batches_per_epoch=CALLS,
            train_batch_size=per_call,
            same_latent=g.share_group_noise,
            num_steps=STEPS,
            guidance_scale=g.guidance_scale,
            noise_level=g.eta,
            global_std=g.advantage_std == "batch",
        ),
        train=SimpleNamespace(
            cfg=g.guidance_scale > 1,
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
        patch["sd3_pipeline_with_logprob"].pipeline_with_logprob,
        patch["sd3_sde_with_logprob"].sde_step_with_logprob,
        SimpleNamespace(tracker=tracker, ema=ema_module),
        config,
        data["weights"],
        scheduler(),
        calls,
        [torch.stack([data["initial_noise"][rows.index(r)] for r in call]) for call in calls],
        data["rewards"],
        cfg.train,
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
    trained = {r for s in out["sets"] for r in s}
    rows = [(j, m) for j in range(PROMPTS) for m in range(GROUP)]
    return {
        "states": out["trajectory"],
        "log_probs": out["log_probs"],
        "means": out["means"],
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
            checkout, args.commit, PATCH_DIR, ["sd3_sde_with_logprob", "sd3_pipeline_with_logprob"], "authors_patch"
        )
        tracker, _ = load_module(checkout, args.commit, "flow_grpo/stat_tracking.py", "authors_stat_tracking")
        ema, _ = load_module(checkout, args.commit, "flow_grpo/ema.py", "authors_ema")
        data = inputs()
        theirs = authors_side(text, patch, tracker, ema, data)
    except (OSError, ImportError) as err:
        print(f"guard_step: could not run flow_grpo's code at {args.checkout}: {err}", file=sys.stderr)
        return 2
    print(f"flow_grpo at {commit}: one GRPO-Guard step of {PROMPTS} prompts x {GROUP}, their epoch's lines")
    ok = print_rows(compare(theirs, project_side(data)))
    store(args.store, {"commit": commit, "inputs": data, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
