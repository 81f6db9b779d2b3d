"""One whole training step of MixGRPO and of MixGRPO-Flash as config/algorithms/mixgrpo.yaml and mixgrpo_flash.yaml
run them, against their authors' own code (Tencent-Hunyuan/MixGRPO) driving the same stand-in transformer (README.md
beside this file).

    python tools/algo_diff/mixgrpo_step.py MIXGRPO [--commit C] [--store FILE]

MIXGRPO: a checkout of MixGRPO, its git directory (a clone or bare mirror), or a plain copy of its tree. Their
`train_one_step` (fastvideo/train_grpo_flux.py) is called as their `main` calls it, on one GPU's share: one prompt's
12 samples, 25 sampling steps at shift 3, the window of the iteration, gradient accumulation 3 (4 optimizer steps).
It runs their own `sample_reference_model` (each sample's rollout by their `run_sample_step` of
fastvideo/utils/sampling_utils.py: Flow-GRPO's `sde` step in the window, deterministic steps outside it, and for
Flash the DPM-Solver++ tail), their group advantages (`advantage_aggr` over one reward), and per sample and window step
their `grpo_one_step`, the clipped loss scaled for accumulation, the backward and, every 3 samples, the clip and the
AdamW step. The functions are taken out of their training script and run in a namespace holding what its module
would: the stand-in transformer (with FSDP's `clip_grad_norm_`), a stand-in VAE and reward, one rank of a process
group. This project's side is the trainer's own `prepare` and `update` (trainer_side.py) with the preset's values, the
stand-in trained in full as theirs. The batch is one whose sliding window starts at step 3 (the Euler steps before it
are in the comparison). Their Flux transformer reads the timestep as int(sigma x 1000) / 1000; the stand-in reads it
so on both sides (the model's interface, not the algorithm's).

Their float32 schedule (as their `sample_reference_model` builds it) is this project's trainer's schedule here: the
schedule is the model's (the same formula in float64 differs by 1.2e-7, which 25 steps compound beyond round-off).
Handed to their code: the group's initial noise (their `torch.randn`, drawn in bf16 there; handed in float32) and each
step's noise (`randn_tensor`). Compared, for each preset: the rollout states (for Flash, those up to the window's end
and the final one: the tail's are on its own noise levels), the window's log-probabilities, the advantages, the
clipped gradient of each of the 4 optimizer updates, and the trained weights after the step.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import sys
import time
import warnings
from types import SimpleNamespace

import torch
from checkout import function_source, load_module, read_source, relative_differences, run_comparison
from mixgrpo_tail import their_timestep
from their_loop import GradientsSeen, Handed, TorchWith
from torch import nn
from trainer_side import StandIn, StandInModel, flat, keyed_noise, one_batch, seeded_weights
from trainer_side import preset_config as tiny_with

TRAIN_FILE, SAMPLING_FILE = "fastvideo/train_grpo_flux.py", "fastvideo/utils/sampling_utils.py"
THEIR_FUNCTIONS = (
    "assert_eq",
    "prepare_latent_image_ids",
    "pack_latents",
    "unpack_latents",
    "grpo_one_step",
    "sample_reference_model",
    "gather_tensor",
    "train_one_step",
)
PRESETS = {
    "mixgrpo": ["config/algorithms/mixgrpo.yaml"],
    "mixgrpo_flash": ["config/algorithms/mixgrpo.yaml", "config/algorithms/mixgrpo_flash.yaml"],
}
"""Each preset's layers after the tiny default (Flash's after MixGRPO's, as its header says)."""
GROUP, STEPS, SHIFT, ACCUMULATION = 12, 25, 3.0, 3
SIZE = 32
"""Their image side (args.h, args.w): a 4 x 4 latent of 16 channels, packed into 4 positions of 64 features."""
LATENT = (4, 1, 8, 8)
"""This project's view of their packed latent: [positions, 1, 8, 8], so that the stand-in mixes the same axis."""
WINDOW_START = 3
"""The sliding window's start at the compared batch."""
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = f"one step of {GROUP} samples of a prompt, {STEPS} steps, {TRAIN_FILE}'s train_one_step"


class QuantizedModel(StandInModel):
    """The stand-in read as their Flux transformer is: the timestep int(sigma x 1000) / 1000."""

    def velocity(self, net, x, sigma, embeds, guidance_scale, condition=None):
        return net(x, their_timestep(sigma))


class FluxStandIn(nn.Module):
    """Their Flux transformer's call on the stand-in (keyword inputs, the timestep already / 1000), with FSDP's
    `clip_grad_norm_`."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, hidden_states, timestep, return_dict=False, **_):
        return (self.net(hidden_states, timestep.float()),)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)


def preset_config(preset: str):
    """The tiny default with the preset, one rank, one prompt x 12 members, 25 steps, the stand-in trained in full."""
    return tiny_with(PRESETS[preset], 1, GROUP, STEPS)


def batch_of(cfg) -> int:
    """The batch whose sliding window starts at WINDOW_START."""
    return WINDOW_START * cfg.grpo.sde_window_shift_every


def inputs() -> dict:
    """Per preset: seeded weights and rewards, and this project's draws for the compared batch: the group's initial
    noise and each member's step noise, and the window."""
    from videogrpo.grpo import sde_window

    found = {}
    for k, preset in enumerate(PRESETS):
        cfg = preset_config(preset)
        generator = torch.Generator().manual_seed(k)
        start, end = sde_window.window(cfg.grpo, cfg.train.seed, batch_of(cfg))
        assert start == WINDOW_START, (start, end)
        found[preset] = {
            "weights": seeded_weights(LATENT[0], generator),
            "rewards": torch.rand(1, GROUP, generator=generator),
            "window": torch.tensor([start, end]),
            **keyed_noise(cfg, batch_of(cfg), LATENT, range(start, end)),
        }
    return found


def load(checkout, commit: str):
    """Their training script's text and their sampling module; the commit."""
    text, where = read_source(checkout, commit, TRAIN_FILE)
    sampling, _ = load_module(checkout, commit, SAMPLING_FILE, "mixgrpo_sampling_utils")
    return SimpleNamespace(text=text, sampling=sampling), where


def their_args(cfg, preset: str):
    """Their command line, as the preset's script sets it (the settings their step reads)."""
    g = cfg.grpo
    flash = g.sde_window_tail == "dpm_solver"
    return SimpleNamespace(
        sampling_steps=STEPS,
        shift=SHIFT,
        w=SIZE,
        h=SIZE,
        t=1,
        init_same_noise=g.share_group_noise,
        training_strategy="part",
        eta=g.eta,
        flow_grpo_sampling=True,
        dpm_algorithm_type="dpmsolver++" if flash else "null",
        dpm_apply_strategy="post",
        dpm_post_compress_ratio=g.sde_window_tail_ratio,
        dpm_solver_order=2,
        dpm_solver_type="midpoint",
        sample_strategy="progressive",
        drop_last_sample=False,
        use_group=True,
        num_generations=GROUP,
        multi_reward_mix="advantage_aggr",
        trimmed_ratio=0.0,
        advantage_rerange_strategy="null",
        clip_range=g.clip_range,
        adv_clip_max=5.0,
        gradient_accumulation_steps=ACCUMULATION,
        kl_coeff=g.kl_coeff,
        output_dir="unused",
        experiment_name=preset,
        reward_model="multi_reward",
    )


def authors_side(loaded, data: dict) -> dict:
    """Their train_one_step per preset, on the stand-in with this project's draws handed in. Their float32 schedule,
    as their sample_reference_model builds it, is handed to this project's side too (`sigmas` in `data`)."""
    found = {}
    for preset, given in data.items():
        given["sigmas"] = loaded.sampling.sd3_time_shift(SHIFT, torch.linspace(1, 0, STEPS + 1))
        found[preset] = their_step(loaded.text, loaded.sampling, preset, given)
    return found


def their_step(text: str, sampling, preset: str, given: dict) -> dict:
    """Their train_one_step of one preset."""
    cfg = preset_config(preset)
    t = cfg.train
    start, end = given["window"].tolist()
    net = FluxStandIn(StandIn(given["weights"]))
    optimizer = GradientsSeen(net.parameters(), lr=t.lr, betas=(0.9, 0.999), weight_decay=t.weight_decay, eps=1e-8)
    packed = (1, LATENT[0], LATENT[2] * LATENT[3] * LATENT[1])
    rollouts, rewards = [], Handed(float(r) for r in given["rewards"][0])

    def sample_step(*args, **kwargs):  # theirs, for one sample, with its step noise handed in and its states kept
        m = len(rollouts)
        noise = [
            given["step_noise"][m, i - start].reshape(packed) if start <= i < end else torch.zeros(packed)
            for i in range(STEPS)
        ]
        sampling.randn_tensor = Handed(noise)
        out = sampling.run_sample_step(*args, **kwargs)
        rollouts.append(out)
        return out

    def compute_reward(images, prompts, models, weights):
        r = rewards()
        return [r], [1.0], {"reward": [r]}, {"reward": [1.0]}

    scope = {
        "torch": None,  # set below, once their unpack_latents is defined
        "dist": SimpleNamespace(
            get_rank=lambda: 1,  # not rank 0: their logging, image files and timing are out of scope
            is_initialized=lambda: False,
            all_reduce=lambda *a, **k: None,
            barrier=lambda: None,
            ReduceOp=SimpleNamespace(AVG=None),
        ),
        "os": SimpleNamespace(environ={"RANK": "1"}, makedirs=lambda *a, **k: None),
        "time": time,
        "tqdm": lambda iterable, **_: iterable,
        "main_print": print,
        "VaeImageProcessor": lambda factor: SimpleNamespace(
            postprocess=lambda image: [SimpleNamespace(save=lambda path: None)]
        ),
        "compute_reward": compute_reward,
        "run_sample_step": sample_step,
        "sd3_time_shift": sampling.sd3_time_shift,
        "flow_grpo_step": sampling.flow_grpo_step,
        "dance_grpo_step": sampling.dance_grpo_step,
        "dpm_step": sampling.dpm_step,
    }
    for name in THEIR_FUNCTIONS:
        exec(function_source(text, name), scope)
    unpacked = scope["unpack_latents"](given["initial_noise"][0].reshape(packed), SIZE, SIZE, 8)  # the group's one
    seen = []  # the advantages their loss clamps, as their train_one_step computed them

    def clamp(value, low, high):
        if low == -5.0:  # the advantage's clamp (adv_clip_max), not the ratio's
            seen.append(value.detach().clone())
        return torch.clamp(value, low, high)

    # their group noise (init_same_noise): ours
    scope["torch"] = TorchWith(randn=Handed([unpacked]), clamp=clamp)
    vae = SimpleNamespace(enable_tiling=lambda: None, decode=lambda latents, return_dict=False: (latents,))
    loader = iter([(torch.zeros(1, 3, 8), torch.zeros(1, 8), torch.zeros(1, 3), "prompt 0")])
    scope["train_one_step"](
        their_args(cfg, preset),
        torch.device("cpu"),
        net,
        vae,
        None,
        optimizer,
        SimpleNamespace(step=lambda: None),  # constant_with_warmup at 0 warm-up steps: the rate stays
        loader,
        None,
        t.max_grad_norm,
        list(range(start, end)),
        batch_of(cfg),
        {"reward": 1.0},
    )
    states = torch.cat([latents for _, _, latents, _ in rollouts]).reshape(GROUP, -1, *LATENT)
    return {
        "states": torch.cat([states[:, : end + 1], states[:, -1:]], dim=1),
        "log_probs": torch.cat([log_probs for *_, log_probs in rollouts])[:, start:end],
        "advantages": torch.cat(seen[:: end - start]),  # each sample's, at its first window step
        "gradients": torch.stack(optimizer.seen),
        "trained": flat(net.parameters()),
    }


def project_side(data: dict) -> dict:
    """The trainer's own prepare and update of the compared batch (trainer_side.one_batch) per preset, on their
    schedule."""
    found = {}
    for preset, given in data.items():
        cfg = preset_config(preset)
        start, end = given["window"].tolist()
        out = one_batch(
            cfg, given["weights"], given["sigmas"], given["rewards"], LATENT, batch=batch_of(cfg), shift=SHIFT,
            model=QuantizedModel(),
        )  # fmt: skip
        states = out["trajectory"]
        found[preset] = {
            "states": torch.cat([states[:, : end + 1], states[:, -1:]], dim=1),
            "log_probs": out["log_probs"][:, start:end],
            "advantages": out["advantages"].flatten(),
            "gradients": torch.stack(out["gradients"]),
            "trained": out["trained"],
        }
    return found


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(preset: name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output."""
    return [
        (f"{preset}: {name}", worst, ok)
        for preset in ours
        for name, worst, ok in relative_differences(theirs[preset], ours[preset], TOLERANCE)
    ]


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="CUDA is not available")  # their autocast("cuda") on this CPU
    return run_comparison(__doc__, "MixGRPO", argv, sys.modules[__name__], load)


if __name__ == "__main__":
    sys.exit(main())
