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

import collections
import concurrent.futures
import contextlib
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from checkout import (
    arguments,
    block_source,
    function_source,
    load_module,
    load_package,
    print_rows,
    read_source,
    relative_differences,
    store,
)
from torch import nn
from trainer_side import StandIn, flat, one_batch, seeded_weights

REPO = Path(__file__).resolve().parents[2]
TRAIN_FILE = "scripts/train_sd3_fast.py"
PATCH_DIR = "flow_grpo/diffusers_patch"
LOOP_FROM, LOOP_TO = "#################### SAMPLING ####################", "ema.step(transformer_trainable_parameters"
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


class Timestepped(nn.Module):
    """Their transformer's call on the stand-in: keyword inputs, the timestep sigma x 1000, a tuple out."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.config = SimpleNamespace(in_channels=LATENT[0])

    def forward(self, hidden_states, timestep, return_dict=False, **_):
        return (self.net(hidden_states, timestep.float() / 1000.0),)


class GradientsSeen(torch.optim.AdamW):
    """Their AdamW, keeping the (clipped) gradient each step takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[torch.Tensor] = []

    def step(self, closure=None):
        self.seen.append(flat(p.grad for group in self.param_groups for p in group["params"]))
        return super().step(closure)


class NotMain:
    """Their accelerator, not the main process: their logging (wandb, sample images) is out of scope."""

    is_main_process = is_local_main_process = False

    def __init__(self, accelerator):
        self.accelerator = accelerator

    def __getattr__(self, name: str):
        return getattr(self.accelerator, name)


class Handed:
    """A queue of given values, handed out one a call."""

    def __init__(self, values):
        self.values = list(values)

    def __call__(self, *args, **kwargs):
        return self.values.pop(0)


def stand_in_pipeline(transformer, scheduler, initial: Handed, prompts: list[str]):
    """What their `pipeline_with_logprob` asks of its `self`, for the stand-in: the given initial noise as
    `prepare_latents`, no classifier-free guidance (guidance 1), the VAE and image processing as the identity."""
    identity = SimpleNamespace(
        config=SimpleNamespace(scaling_factor=1.0, shift_factor=0.0),
        dtype=torch.float32,
        decode=lambda latents, return_dict=False: (latents,),
    )
    return SimpleNamespace(
        transformer=transformer,
        scheduler=scheduler,
        check_inputs=lambda *a, **k: None,
        encode_prompt=lambda **k: (k["prompt_embeds"], None, k["pooled_prompt_embeds"], None),
        do_classifier_free_guidance=False,
        prepare_latents=initial,
        progress_bar=lambda total: contextlib.nullcontext(SimpleNamespace(update=lambda: None)),
        default_sample_size=1,
        vae_scale_factor=1,
        joint_attention_kwargs=None,
        clip_skip=None,
        _execution_device=torch.device("cpu"),
        vae=identity,
        image_processor=SimpleNamespace(postprocess=lambda image, output_type: image),
        maybe_free_model_hooks=lambda: None,
        tokenizer=SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [prompts[int(i[0])] for i in ids]),
    )


def authors_side(text: str, patch: dict, tracker, ema_module, data: dict) -> dict:
    """Their epoch, sampling to the EMA's step, on the stand-in with this project's draws handed in."""
    from accelerate import Accelerator

    cfg = preset_config()
    g, t = cfg.grpo, cfg.train
    rows = [(j, m) for j in range(PROMPTS) for m in range(GROUP)]
    in_sets = [tuple(r) for s in data["sets"].tolist() for r in s]
    order = in_sets + [r for r in rows if r not in in_sets]  # their sampling order: each update's rows in turn
    per_call = len(rows) // CALLS
    calls = [order[k * per_call : (k + 1) * per_call] for k in range(CALLS)]
    start, end = data["window"].tolist()
    window_size, (lo, hi) = g.sde_window_size, g.sde_window_range

    def randint(a: int, b: int) -> int:  # their window draw: this project's start, from the same range
        assert (a, b) == (lo, hi - window_size), (a, b)
        return start

    patch["sd3_pipeline_with_logprob_fast"].random = SimpleNamespace(randint=randint)
    position = {r: n for n, r in enumerate(rows)}
    noise = [
        torch.stack(
            [data["step_noise"][position[r], i - start] if start <= i < end else torch.zeros(LATENT) for r in call]
        )
        for call in calls
        for i in range(STEPS)
    ]
    patch["sd3_sde_with_logprob"].randn_tensor = Handed(noise)
    initial = Handed(torch.stack([data["initial_noise"][position[r]] for r in call]) for call in calls)
    prompts = [f"prompt {j}" for j in range(PROMPTS)]
    rewards = Handed({"avg": np.array([float(data["rewards"][r]) for r in call])} for call in calls)

    net = StandIn(data["weights"])
    params = list(net.parameters())
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=CALLS // 2 * window_size)
    transformer, optimizer = accelerator.prepare(
        Timestepped(net), GradientsSeen(params, lr=t.lr, betas=(0.9, 0.999), weight_decay=t.weight_decay, eps=1e-8)
    )
    pipeline = stand_in_pipeline(transformer, scheduler(), initial, prompts)
    sampled = []

    def pipeline_with_logprob(pipeline, **kwargs):  # theirs, its rollouts kept
        out = patch["sd3_pipeline_with_logprob_fast"].pipeline_with_logprob(pipeline, **kwargs)
        sampled.append(out)
        return out

    def embeddings(prompts_, text_encoders, tokenizers, max_sequence_length, device):
        return torch.zeros(len(prompts_), 1), torch.zeros(len(prompts_), 1)

    def tokenize(prompts_, **_):
        return SimpleNamespace(input_ids=torch.tensor([[prompts.index(p)] for p in prompts_]))

    def submit(fn, *args, **kwargs):
        done = concurrent.futures.Future()
        done.set_result((fn(*args, **kwargs), {}))
        return done

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
            sde_window_size=window_size,
            sde_window_range=(lo, hi),
            sde_type={"flowcps": "cps", "flowgrpo_sde": "sde"}[g.sampler],
        ),
        train=SimpleNamespace(
            cfg=False,
            beta=g.kl_coeff,
            adv_clip_max=5,
            clip_range=g.clip_range,
            num_inner_epochs=g.update_passes,
            max_grad_norm=t.max_grad_norm,
            ema=True,
        ),
    )
    stat_tracker = tracker.PerPromptStatTracker(g.advantage_std == "batch")
    computed = []
    real_update = stat_tracker.update
    stat_tracker.update = lambda *a, **k: computed.append(real_update(*a, **k)) or computed[-1]
    ema = ema_module.EMAModuleWrapper(params, decay=t.ema_decay, update_step_interval=t.ema_every, device="cpu")
    scope = {
        "torch": torch,
        "np": np,
        "time": time,
        "defaultdict": collections.defaultdict,
        "tqdm": lambda iterable, **_: iterable,
        "config": config,
        "pipeline": pipeline,
        "pipeline_with_logprob": pipeline_with_logprob,
        "sde_step_with_logprob": patch["sd3_sde_with_logprob"].sde_step_with_logprob,
        "train_sampler": SimpleNamespace(set_epoch=lambda epoch: None),
        "train_iter": iter([([prompts[j] for j, _ in call], [{}] * len(call)) for call in calls]),
        "compute_text_embeddings": embeddings,
        "text_encoders": None,
        "tokenizers": [tokenize],
        "sample_neg_prompt_embeds": None,
        "sample_neg_pooled_prompt_embeds": None,
        "autocast": contextlib.nullcontext,
        "executor": SimpleNamespace(submit=submit),
        "reward_fn": lambda images, prompts_, metadata, only_strict: rewards(),
        "accelerator": NotMain(accelerator),
        "stat_tracker": stat_tracker,
        "num_train_timesteps": window_size,
        "transformer": transformer,
        "optimizer": optimizer,
        "epoch": 0,
        "global_step": 0,
        "ema": ema,
        "transformer_trainable_parameters": params,
        "wandb": None,
    }
    for name in ("compute_log_prob", "calculate_zero_std_ratio"):
        exec(function_source(text, name), scope)
    exec(compile(block_source(text, LOOP_FROM, LOOP_TO), TRAIN_FILE, "exec"), scope)
    place = {r: (k, n) for k, call in enumerate(calls) for n, r in enumerate(call)}
    by_row = lambda per_call_values: torch.stack([per_call_values[place[r][0]][place[r][1]] for r in rows])  # noqa: E731
    states = [torch.stack(latents, dim=1) for _, latents, _, _ in sampled]
    log_probs = [torch.stack(logps, dim=1) for _, _, logps, _ in sampled]
    mine = lambda values: torch.stack([values[order.index(r)] for r in rows])  # noqa: E731
    return {
        "states": by_row(states),
        "log_probs": by_row(log_probs),
        "advantages": mine(torch.as_tensor(computed[0][:, 0]).float()),
        "kept": mine(scope["mask"].float()),
        "gradients": torch.stack(optimizer.optimizer.seen),
        "trained": flat(params),
        "ema": flat(ema.ema_parameters),
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
