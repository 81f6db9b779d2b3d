"""One whole training step of DiffusionNFT as config/algorithms/diffusion_nft.yaml runs it, against its authors' own
code (NVlabs/DiffusionNFT) driving the same stand-in transformer (README.md beside this file).

    python tools/algo_diff/nft_step.py DIFFUSION_NFT [--commit C] [--store FILE]

DIFFUSION_NFT: a checkout of DiffusionNFT, its git directory (a clone or bare mirror), or a plain copy of its tree.
The stand-in transformer is v(x, sigma) = (W x + b)(1 + sigma), a module with parameters, in three weight sets as
their PEFT model holds them: the trained adapter, the old policy's and the base (the KL's reference). One step, 2
prompts x 4 members, 10 sampling steps at shift 3:
- the rollouts, from this project's initial noise, with the old policy: their `run_sampling` (flow_grpo/
  diffusers_patch/solver.py, solver dpm2, deterministic);
- the advantages of given rewards: their `PerPromptStatTracker(global_std=True)` (flow_grpo/stat_tracking.py) on
  the rewards repeated over the trained levels, as their loop does;
- the training: their loop lines, from `for i, train_sample_batch in tqdm(` to `ema.step(...)` in
  scripts/train_nft_sd3.py (every trained level's fresh noising, the old, trained and reference velocities, their
  loss, its scaling for gradient accumulation, the clipped AdamW step, the EMA's step), then their old-policy
  update at the end of the epoch;
against the trainer's own `prepare` and `update` with the preset's values (trainer_side.py: the rollouts with the
old policy swapped in, the advantages, the replay, the clipped step, the EMA's blends, the old policy's mix).
Where the two draw differently by design (docs/fidelity.md: their noise levels are a permutation per sample, this
project's one draw per update shared by the rows; their noise is torch's stream, this project's keyed), this
project's draws are handed to their loop: its `timesteps` and its `torch.randn_like`. Compared: every rollout state,
the advantages, the clipped gradient the optimizer steps on, and the trained weights, the EMA and the old policy
after the step.

--store FILE writes the inputs and their outputs (what tests/test_algo_diff.py compares against without the
checkout). Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from types import SimpleNamespace

import torch
from checkout import block_source, function_source, load_module, read_source, relative_differences, run_comparison
from their_loop import GradientsSeen, Handed, TorchWith
from torch import nn
from trainer_side import StandIn, flat, keyed_noise, one_batch
from trainer_side import preset_config as tiny_with

TRAIN_FILE = "scripts/train_nft_sd3.py"
LOOP_FROM, LOOP_TO = "for i, train_sample_batch in tqdm(", "ema.step(transformer_trainable_parameters, global_step)"
MIX_FROM, MIX_TO = "decay = return_decay(global_step, config.decay_type)", "tgt_param.data.copy_("
PROMPTS, GROUP, STEPS, SHIFT = 2, 4, 10, 3.0
LATENT = (4, 3, 4, 4)  # [C, F, h, w]
TOLERANCE = 1e-6
"""Largest relative difference taken as float round-off."""
HEADER = f"one DiffusionNFT step of {PROMPTS} prompts x {GROUP}, {STEPS} steps, {TRAIN_FILE}'s loop lines"


class Adapters(nn.Module):
    """Their PEFT model, called as their loop calls it: the trained adapter `default`, the old policy's `old`, the
    base while the adapter is disabled; the timestep is sigma x 1000."""

    def __init__(self, data: dict):
        super().__init__()
        self.nets = nn.ModuleDict({name: StandIn(data[name]) for name in ("default", "old", "base")})
        self.active = "default"

    def set_adapter(self, name: str) -> None:
        self.active = name

    @contextlib.contextmanager
    def disable_adapter(self):
        before, self.active = self.active, "base"
        try:
            yield
        finally:
            self.active = before

    def forward(self, hidden_states, timestep, encoder_hidden_states=None, pooled_projections=None, return_dict=False):
        return (self.nets[self.active](hidden_states, timestep.float() / 1000.0),)


class Wrapped(nn.Module):
    """Their DistributedDataParallel wrapper: `.module` is the model."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


def preset_config():
    """The tiny default with config/algorithms/diffusion_nft.yaml, one rank, 2 prompts x 4 members, the stand-in
    trained in full (their adapter's weights are the stand-in's)."""
    return tiny_with(["config/algorithms/diffusion_nft.yaml"], PROMPTS, GROUP, STEPS)


def inputs() -> dict:
    """Seeded weights (base; trained a little off it; old between), initial noise, rewards, the schedule, and this
    project's draws for update 1 of batch 0: the trained noise levels and each level's noise, rows in their order
    (prompt-major)."""
    from videogrpo.grpo import nft, sde_window
    from videogrpo.grpo.draws import seeded_normal
    from videogrpo.grpo.samplers import sigma_schedule

    cfg = preset_config()
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    channels = LATENT[0]
    base = {"mix": torch.randn(channels, channels, generator=generator) / channels,
            "bias": 0.1 * torch.randn(channels, generator=generator)}  # fmt: skip
    trained = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in base.items()}
    old = {k: 0.5 * base[k] + 0.5 * trained[k] for k in base}
    rows = PROMPTS * GROUP
    levels = sde_window.replayed_steps(cfg.grpo, cfg.train.seed, 0, 1)
    key = (cfg.train.seed, nft.NOISE_TAG, 0)
    noises = [
        torch.stack([seeded_normal(LATENT, cpu, *key, n // GROUP, n % GROUP, level) for n in range(rows)])
        for level in levels
    ]
    return {
        "base": base,
        "default": trained,
        "old": old,
        **keyed_noise(cfg, 0, LATENT),
        "rewards": torch.rand(PROMPTS, GROUP, generator=generator),
        "sigmas": sigma_schedule(STEPS, SHIFT).float(),
        "levels": torch.tensor(levels),
        "noises": noises,
    }


def load(checkout, commit: str):
    """Their training script's text, solver, stat tracker and EMA; the commit."""
    text, where = read_source(checkout, commit, TRAIN_FILE)
    solver, _ = load_module(checkout, commit, "flow_grpo/diffusers_patch/solver.py", "authors_solver")
    tracker, _ = load_module(checkout, commit, "flow_grpo/stat_tracking.py", "authors_stat_tracking")
    ema, _ = load_module(checkout, commit, "flow_grpo/ema.py", "authors_ema")
    return SimpleNamespace(text=text, solver=solver, tracker=tracker, ema=ema), where


def authors_side(loaded, data: dict) -> dict:
    """Their sampling, stat tracker, training loop lines and old-policy update on the stand-in."""
    text, solver, tracker, ema_module = loaded.text, loaded.solver, loaded.tracker, loaded.ema
    cfg = preset_config()
    g, t = cfg.grpo, cfg.train
    model = Adapters(data)
    wrapped = Wrapped(model)
    rows, levels = PROMPTS * GROUP, [int(i) for i in data["levels"]]
    model.set_adapter("old")  # they sample with the old policy
    with torch.no_grad():
        _, states, _ = solver.run_sampling(
            lambda z, sigma: model(z, torch.full((len(z),), float(sigma) * 1000))[0], data["initial_noise"].clone(),
            data["sigmas"], solver="dpm2", determistic=True,
        )  # fmt: skip
    model.set_adapter("default")
    x0 = states[-1]
    prompts = [f"prompt {n // GROUP}" for n in range(rows)]
    rewards = data["rewards"].flatten()[:, None].repeat(1, len(levels)).numpy()
    advantages = torch.as_tensor(tracker.PerPromptStatTracker(True).update(prompts, rewards), dtype=torch.float32)
    params = list(model.nets["default"].parameters())
    ema = ema_module.EMAModuleWrapper(params, decay=t.ema_decay, update_step_interval=t.ema_every, device="cpu")
    optimizer = GradientsSeen(params, lr=t.lr, betas=(0.9, 0.999), weight_decay=t.weight_decay, eps=1e-8)
    batch = {
        "latents_clean": x0,
        "timesteps": (data["sigmas"][levels] * 1000).repeat(rows, 1),
        "advantages": advantages,
        "prompt_embeds": torch.zeros(rows, 1),
        "pooled_prompt_embeds": torch.zeros(rows, 1),
    }
    config = SimpleNamespace(
        beta=g.nft_beta,
        decay_type=1,
        sample=SimpleNamespace(guidance_scale=g.guidance_scale),
        train=SimpleNamespace(
            adv_clip_max=g.nft_adv_clip, adv_mode="all", beta=g.kl_coeff, max_grad_norm=t.max_grad_norm, ema=True
        ),
        use_lora=True,
    )
    scope = {
        "torch": TorchWith(randn_like=Handed(n.clone() for n in data["noises"])),
        "tqdm": lambda iterable, **_: iterable,
        "samples_batched_list": [batch],  # one micro-batch of every row: one optimizer update
        "epoch": 0,
        "inner_epoch": 0,
        "is_main_process": lambda rank: False,
        "rank": 0,
        "config": config,
        "num_train_timesteps": len(levels),
        "torch_autocast": lambda **_: contextlib.nullcontext(),
        "enable_amp": False,
        "mixed_precision_dtype": torch.float32,
        "transformer_ddp": wrapped,
        "effective_grad_accum_steps": len(levels),
        "current_accumulated_steps": 0,
        "scaler": None,
        "optimizer": optimizer,
        "gradient_update_times": 0,
        "info_accumulated": collections.defaultdict(list),
        "defaultdict": collections.defaultdict,
        "dist": SimpleNamespace(all_reduce=lambda *a, **k: None, ReduceOp=SimpleNamespace(AVG=None)),
        "device": torch.device("cpu"),
        "wandb": None,
        "global_step": 0,
        "ema": ema,
        "transformer_trainable_parameters": params,
    }
    exec(compile(block_source(text, LOOP_FROM, LOOP_TO), TRAIN_FILE, "exec"), scope)
    decay_scope = {}
    exec(function_source(text, "return_decay"), decay_scope)
    old_params = list(model.nets["old"].parameters())
    mix = {
        "torch": torch,
        "return_decay": decay_scope["return_decay"],
        "global_step": scope["global_step"],
        "config": config,
        "transformer_trainable_parameters": params,
        "old_transformer_trainable_parameters": old_params,
    }
    exec(compile(block_source(text, MIX_FROM, MIX_TO), TRAIN_FILE, "exec"), mix)
    (gradient,) = optimizer.seen  # one optimizer update
    return {
        "states": torch.stack(states, dim=1),
        "advantages": advantages[:, 0],
        "gradient": gradient,
        "trained": flat(params),
        "ema": flat(ema.ema_parameters),
        "old": flat(old_params),
    }


def project_side(data: dict) -> dict:
    """The trainer's own prepare and update of batch 0 (trainer_side.one_batch) with the preset's values."""
    out = one_batch(
        preset_config(), data["default"], data["sigmas"], data["rewards"], LATENT, old=data["old"], base=data["base"]
    )
    (gradient,) = out["gradients"]  # one optimizer update
    return {
        "states": out["trajectory"],
        "advantages": out["advantages"].flatten(),
        "gradient": gradient,
        "trained": out["trained"],
        "ema": out["ema"],
        "old": out["old"],
    }


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within TOLERANCE) per compared output."""
    return relative_differences(theirs, ours, TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    return run_comparison(__doc__, "DiffusionNFT", argv, sys.modules[__name__], load)


if __name__ == "__main__":
    sys.exit(main())
