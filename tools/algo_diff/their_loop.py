"""The authors' side of a whole-step comparison: what their training loops ask of their surroundings, as stand-ins,
and one epoch of a Flow-GRPO training script (train_sd3_fast.py, train_sd3_GRPO_Guard.py) run from its own lines
(README.md beside this file).

`flow_grpo_epoch` execs a script's lines from `#### SAMPLING ####` to the EMA's step in a namespace that holds what
the script's `main` would: a stand-in pipeline over the stand-in transformer for their `pipeline_with_logprob`, their
stat tracker and EMA, accelerate's own `Accelerator` (its gradient accumulation and its optimizer wrapper), and the
given rewards. The draws their code takes from torch's and Python's streams are handed in by the caller.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import time
from types import SimpleNamespace

import numpy as np
import torch
from checkout import block_source, function_source, load_module, load_package, read_source
from torch import nn
from trainer_side import StandIn, flat

LOOP_FROM, LOOP_TO = "#################### SAMPLING ####################", "ema.step(transformer_trainable_parameters"
SD3_SHIFT = 3.0
"""The flow shift of their SD3 configs."""


class Handed:
    """A queue of given values, handed out one a call whatever the call's arguments."""

    def __init__(self, values):
        self.values = list(values)

    def __call__(self, *args, **kwargs):
        return self.values.pop(0)


class TorchWith:
    """`torch` for their loop lines, with some functions replaced (their draws, handed in)."""

    def __init__(self, **replaced):
        self.replaced = replaced

    def __getattr__(self, name: str):
        return self.replaced[name] if name in self.replaced else getattr(torch, name)


class GradientsSeen(torch.optim.AdamW):
    """Their AdamW, keeping the (clipped) gradient each step takes: one AdamW step from fresh moments moves each
    weight by about lr x the gradient's sign, so the weights after it say little of the loss; the gradient says it
    all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[torch.Tensor] = []

    def step(self, closure=None):
        self.seen.append(flat(p.grad for group in self.param_groups for p in group["params"]))
        return super().step(closure)


class Timestepped(nn.Module):
    """Their transformer's call on the stand-in: keyword inputs, the timestep sigma x 1000, a tuple out."""

    def __init__(self, net: nn.Module, channels: int):
        super().__init__()
        self.net = net
        self.config = SimpleNamespace(in_channels=channels)

    def forward(self, hidden_states, timestep, return_dict=False, **_):
        return (self.net(hidden_states, timestep.float() / 1000.0),)


class NotMain:
    """Their accelerator, not the main process: their logging (wandb, sample images) is out of scope."""

    is_main_process = is_local_main_process = False

    def __init__(self, accelerator):
        self.accelerator = accelerator

    def __getattr__(self, name: str):
        return getattr(self.accelerator, name)


class StandInPipeline(SimpleNamespace):
    """What their `pipeline_with_logprob` asks of its `self`, for the stand-in (`stand_in_pipeline`); guidance as
    diffusers' pipeline reads it, from the scale the function sets."""

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1

    @property
    def interrupt(self) -> bool:
        return self._interrupt


def stand_in_pipeline(transformer, scheduler, initial: Handed, prompts: list[str]) -> StandInPipeline:
    """The stand-in pipeline: the given initial noise as `prepare_latents`, the VAE and image processing as the
    identity, the prompt ids decoded."""
    identity = SimpleNamespace(
        config=SimpleNamespace(scaling_factor=1.0, shift_factor=0.0),
        dtype=torch.float32,
        decode=lambda latents, return_dict=False: (latents,),
    )
    return StandInPipeline(
        transformer=transformer,
        scheduler=scheduler,
        check_inputs=lambda *a, **k: None,
        encode_prompt=lambda **k: tuple(
            k[name]
            for name in (
                "prompt_embeds",
                "negative_prompt_embeds",
                "pooled_prompt_embeds",
                "negative_pooled_prompt_embeds",
            )
        ),  # fmt: skip
        _interrupt=False,
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


def sd3_scheduler(steps: int, shift: float):
    """Their SD3 scheduler (diffusers' FlowMatchEulerDiscreteScheduler) set to `steps` steps at `shift`."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    found = FlowMatchEulerDiscreteScheduler(shift=shift)
    found.set_timesteps(steps)
    return found


def flow_grpo_config(cfg, calls: int, per_call: int) -> SimpleNamespace:
    """Their config's fields that an epoch of their Flow-GRPO scripts reads, from this project's `cfg` with a preset:
    `calls` sampling batches of `per_call` samples an epoch."""
    from videogrpo.grpo.sde_window import window_range

    g = cfg.grpo
    return SimpleNamespace(
        resolution=1,  # read by their pipeline's prepare_latents only: the stand-in's hands out given noise
        per_prompt_stat_tracking=True,
        rationorm=g.grpo_guard,
        sample=SimpleNamespace(
            num_batches_per_epoch=calls,
            train_batch_size=per_call,
            same_latent=g.share_group_noise,
            num_steps=g.sampling_steps,
            guidance_scale=g.guidance_scale,
            noise_level=g.eta,
            global_std=g.advantage_std == "batch",
            sde_type={"flowcps": "cps", "flowgrpo_sde": "sde"}[g.sampler],
            sde_window_size=g.sde_window_size,
            sde_window_range=window_range(g),
        ),
        train=SimpleNamespace(
            cfg=g.guidance_scale > 1,
            beta=g.kl_coeff,
            adv_clip_max=5,  # config/base.py's, and the clamp this project's advantages take
            clip_range=g.clip_range,
            num_inner_epochs=g.update_passes,
            max_grad_norm=cfg.train.max_grad_norm,
            ema=True,
        ),
    )


def load_flow_grpo(checkout, commit: str, script: str, pipeline: str) -> tuple[SimpleNamespace, str]:
    """What an epoch of their Flow-GRPO `script` runs, from `checkout` at `commit`: the script's text, their sampling
    `pipeline` module (flow_grpo/diffusers_patch/<pipeline>.py) with the step module it imports, their stat tracker
    and their EMA; the commit."""
    text, where = read_source(checkout, commit, script)
    patch, _ = load_package(
        checkout, commit, "flow_grpo/diffusers_patch", ["sd3_sde_with_logprob", pipeline], f"authors_{pipeline}"
    )
    tracker, _ = load_module(checkout, commit, "flow_grpo/stat_tracking.py", "authors_stat_tracking")
    ema, _ = load_module(checkout, commit, "flow_grpo/ema.py", "authors_ema")
    step = patch["sd3_sde_with_logprob"]
    return SimpleNamespace(text=text, pipeline=patch[pipeline], step=step, tracker=tracker, ema=ema), where


def flow_grpo_epoch(
    loaded: SimpleNamespace,
    file: str,
    cfg,
    weights: dict,
    calls: list[list[tuple[int, int]]],
    initial: list[torch.Tensor],
    rewards: torch.Tensor,
    accumulation: int,
    num_train_timesteps: int,
    torch_in_loop=torch,
) -> dict:
    """Their epoch (the script `file`, as `load_flow_grpo` gives it in `loaded`), sampling to the EMA's step, on the
    stand-in from `weights`: one pipeline call per list of rows in `calls` (`initial` its initial noise, `rewards`
    [P, G] by row), `cfg` this project's config with the preset (their config's fields, the learning rate, weight
    decay and EMA), `accumulation` accelerate's gradient accumulation steps, `torch_in_loop` the torch their loop
    lines see. Returns their rollouts (`sampled`, per call), the advantages, the mask of kept rows, each optimizer
    step's gradient, and the trained and EMA weights."""
    from accelerate import Accelerator

    t = cfg.train
    config = flow_grpo_config(cfg, len(calls), len(calls[0]))
    scheduler = sd3_scheduler(cfg.grpo.sampling_steps, SD3_SHIFT)
    prompt_count = 1 + max(j for call in calls for j, _ in call)
    prompts = [f"prompt {j}" for j in range(prompt_count)]
    net = StandIn(weights)
    params = list(net.parameters())
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    transformer, optimizer = accelerator.prepare(
        Timestepped(net, initial[0].shape[1]),
        GradientsSeen(params, lr=t.lr, betas=(0.9, 0.999), weight_decay=t.weight_decay, eps=1e-8),
    )
    pipeline = stand_in_pipeline(transformer, scheduler, Handed(initial), prompts)
    sampled, computed = [], []

    def pipeline_with_logprob(pipeline, **kwargs):  # theirs, its rollouts kept
        out = loaded.pipeline.pipeline_with_logprob(pipeline, **kwargs)
        sampled.append(out)
        return out

    def submit(fn, *args, **kwargs):
        done = concurrent.futures.Future()
        done.set_result((fn(*args, **kwargs), {}))
        return done

    given = Handed({"avg": np.array([float(rewards[r]) for r in call])} for call in calls)
    tracker = loaded.tracker.PerPromptStatTracker(config.sample.global_std)
    real_update = tracker.update
    tracker.update = lambda *a, **k: computed.append(real_update(*a, **k)) or computed[-1]
    ema = loaded.ema.EMAModuleWrapper(params, decay=t.ema_decay, update_step_interval=t.ema_every, device="cpu")
    per_call = len(calls[0])
    zeros = torch.zeros(per_call, 1)
    scope = {
        "torch": torch_in_loop,
        "np": np,
        "time": time,
        "defaultdict": collections.defaultdict,
        "tqdm": lambda iterable, **_: iterable,
        "config": config,
        "pipeline": pipeline,
        "pipeline_with_logprob": pipeline_with_logprob,
        "sde_step_with_logprob": loaded.step.sde_step_with_logprob,
        "train_sampler": SimpleNamespace(set_epoch=lambda epoch: None),
        "train_iter": iter([([prompts[j] for j, _ in call], [{}] * len(call)) for call in calls]),
        "compute_text_embeddings": lambda texts, *a, **k: (torch.zeros(len(texts), 1), torch.zeros(len(texts), 1)),
        "text_encoders": None,
        "tokenizers": [lambda texts, **_: SimpleNamespace(input_ids=torch.tensor([[prompts.index(p)] for p in texts]))],
        "sample_neg_prompt_embeds": zeros,
        "sample_neg_pooled_prompt_embeds": zeros,
        "train_neg_prompt_embeds": zeros,
        "train_neg_pooled_prompt_embeds": zeros,
        "autocast": contextlib.nullcontext,
        "executor": SimpleNamespace(submit=submit),
        "reward_fn": lambda images, prompts_, metadata, only_strict: given(),
        "accelerator": NotMain(accelerator),
        "stat_tracker": tracker,
        "num_train_timesteps": num_train_timesteps,
        "transformer": transformer,
        "optimizer": optimizer,
        "epoch": 0,
        "global_step": 0,
        "ema": ema,
        "transformer_trainable_parameters": params,
        "wandb": None,
    }
    for name in ("compute_log_prob", "calculate_zero_std_ratio"):
        exec(function_source(loaded.text, name), scope)
    exec(compile(block_source(loaded.text, LOOP_FROM, LOOP_TO), file, "exec"), scope)
    return {
        "sampled": sampled,
        "advantages": torch.as_tensor(computed[0][:, 0]).float(),
        "mask": scope["mask"].float(),
        "gradients": torch.stack(optimizer.optimizer.seen),
        "trained": flat(params),
        "ema": flat(ema.ema_parameters),
    }
