"""This project's side of a whole-step comparison: one rollout batch through the trainer's own functions, on a
stand-in transformer (README.md beside this file), as a preset's tool sets it up (which batch, the schedule, rewards).

`one_batch` makes a `grpo.trainer.Trainer` without its model loading (its attributes set here: the stand-in model,
the experts built by `Experts.build`, given rewards in place of the scorer) and runs its own `prepare` (the keyed
initial and step noise, the rollouts chunk by chunk, the window, the old policy swapped in) and `update` (the
advantages, the kept rows, the optimizer updates' sets, each update's replay and backward, the clipped optimizer step,
the EMA's blends around it, the old policy's mix after the batch). What is compared is what the trainer does, not a
copy of its sequence. The stand-in is v(x, sigma) = (W x + b)(1 + sigma): a velocity that depends on the state and the
noise level, with parameters to train. The model's text and frame encoders are out of scope (zeros), and so is LoRA:
the stand-in is trained in full, as the authors' loops train their adapters' parameters.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


class StandIn(nn.Module):
    """v(x, sigma) = (W x + b)(1 + sigma): a velocity that depends on the state and the noise level."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.mix = nn.Parameter(weights["mix"].clone())
        self.bias = nn.Parameter(weights["bias"].clone())

    def forward(self, x: torch.Tensor, sigma) -> torch.Tensor:
        s = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1, *([1] * (x.ndim - 1)))
        mixed = torch.einsum("dc,bc...->bd...", self.mix, x.float())
        return (mixed + self.bias.view(1, -1, *([1] * (x.ndim - 2)))) * (1 + s)


class StandInModel:
    """What the trainer asks of its model, for the stand-in: nothing pinned (every latent frame is generated, as an
    image model's one), float32 trajectories, zero text embeddings, decoding as the identity."""

    pins_first_frame = False
    trajectory_dtype = torch.float32

    def encode_conditions(self, prompts, first_frames, height, width, frames):
        return torch.zeros(len(prompts), 1), torch.zeros(len(prompts), 1)

    def velocity(self, net, x, sigma, embeds, guidance_scale, condition=None):
        return net(x, sigma)

    def decode(self, latents):
        return list(latents)


class GivenRewards:
    """The scorer's calls, handing out given rewards in the order the rollouts are submitted."""

    def __init__(self, rewards: list[float]):
        self.rewards = list(rewards)

    def submit(self, request):
        return self.rewards.pop(0)

    def collect(self, futures: list) -> list[dict]:
        return [{"score": float(r)} for r in futures]


def seeded_weights(channels: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The stand-in's weights, drawn from `generator`."""
    return {
        "mix": torch.randn(channels, channels, generator=generator) / channels,
        "bias": 0.1 * torch.randn(channels, generator=generator),
    }


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in params])


def samples(prompts: int, where: Path):
    """`prompts` training samples whose prompts read "prompt <j>" (files under `where`, as a dataset holds them)."""
    from videogrpo.data.dataset import SampleRef

    refs = []
    for j in range(prompts):
        ref = SampleRef("task", f"{j:03d}", where)
        (ref.directory / "video").mkdir(parents=True)
        (ref.directory / "video/prompt.txt").write_text(f"prompt {j}\n")
        refs.append(ref)
    return refs


def preset_config(layers: list[str], prompts: int, group: int, steps: int, **train):
    """The tiny default with a preset's `layers`, on one rank: `prompts` x `group` members, `steps` sampling steps,
    each wave rolled out at once, the stand-in trained in full (no LoRA); `train`: train-section fields to set."""
    from videogrpo import config

    cfg = config.load([REPO / "config/config.yaml", *(REPO / layer for layer in layers)])
    cfg.grpo.prompts_per_step, cfg.grpo.group_size, cfg.grpo.sampling_steps = prompts, group, steps
    cfg.grpo.sample_batch_size, cfg.parallel.procs_per_node, cfg.train.lora_rank = None, 1, 0
    for name, value in train.items():
        setattr(cfg.train, name, value)
    return cfg


def keyed_noise(cfg, batch: int, shape, steps: range = range(0)) -> dict[str, torch.Tensor]:
    """This project's draws for batch `batch`, handed to the authors' code: each row's initial noise
    (`initial_noise`, [P x G rows in (prompt, member) order, ...]) and its noise at `steps` (`step_noise`, [rows,
    len(steps), ...]), by the trainer's keys (grpo.assignment)."""
    from videogrpo.grpo import assignment, minibatches
    from videogrpo.grpo.draws import seeded_normal

    g, seed = cfg.grpo, cfg.train.seed
    rows = minibatches.batch_rows(g)
    initial = [
        seeded_normal(shape, CPU, *assignment.init_noise_key(seed, batch, j, m, g.share_group_noise)) for j, m in rows
    ]
    found = {"initial_noise": torch.stack(initial)}
    if len(steps):
        found["step_noise"] = torch.stack(
            [
                torch.stack(
                    [seeded_normal(shape, CPU, *assignment.step_noise_key(seed, batch, j, m, i)) for i in steps]
                )
                for j, m in rows
            ]
        )
    return found


def update_rows(cfg, batch: int, rewards: torch.Tensor) -> torch.Tensor:
    """The rows (prompt, member) each optimizer update of batch `batch` trains, [updates, rows, 2], by the trainer's
    own functions (the advantages, the kept rows, the update sets), for `rewards` [P, G]."""
    from videogrpo.grpo import minibatches
    from videogrpo.grpo.advantages import group_advantages

    g, seed = cfg.grpo, cfg.train.seed
    advantages = group_advantages(rewards, g.advantage_std, g.advantage_std_unbiased, g.advantage_eps)
    kept = minibatches.kept_rows(g, seed, batch, advantages) if g.drop_zero_advantage else None
    return torch.tensor([sorted(r) for _, r in minibatches.update_sets(g, seed, batch, kept)])


def one_batch(
    cfg,
    weights: dict,
    sigmas: torch.Tensor,
    rewards: torch.Tensor,
    shape,
    old: dict | None = None,
    base: dict | None = None,
    batch: int = 0,
    shift: float | None = None,
    model: StandInModel | None = None,
) -> dict:
    """Batch `batch` of `cfg` (one rank) rolled out and trained in update 1 by the trainer's own functions, the
    stand-in starting from `weights` (DiffusionNFT's old policy from `old`; the KL's frozen reference from `base`,
    else the initial weights), `rewards` [P, G] given, `shift` the flow shift (a DPM-Solver tail re-spaces by it),
    `model` the stand-in model (StandInModel). Returns what it did: `trajectory` [P x G rows in (prompt, member)
    order, T + 1, ...], `log_probs` and (GRPO-Guard) `means`, the `advantages` [P, G], the rows each optimizer
    update trained (`sets`; `kept`: 1 for each row one of them trained, by row), the clipped gradient each stepped
    on, and the trained weights, the EMA's and the old policy's after the batch (flat)."""
    from videogrpo.grpo import assignment, offload, replay
    from videogrpo.grpo.experts import Experts
    from videogrpo.grpo.peak_memory import PeakMemory
    from videogrpo.grpo.trainer import Trainer
    from videogrpo.grpo.weight_copy import WeightCopy

    g = cfg.grpo
    assert cfg.parallel.procs_per_node * cfg.parallel.nodes == 1 and cfg.train.lora_rank == 0
    policy = StandIn(weights)
    experts = Experts.build({"transformer": policy}, False, cfg, 1, CPU)
    if base is not None and experts.experts[0].reference is not None:  # a reference only with a KL term
        for param, name in zip(experts.experts[0].reference.parameters(), ("mix", "bias")):
            param.data.copy_(base[name])
    gradients = []
    for expert in experts.experts:  # the gradient each optimizer step takes, after the clip
        step = expert.optimizer.step
        expert.optimizer.step = lambda *a, _step=step, _e=expert, **k: (
            gradients.append(flat(p.grad for p in _e.params)),
            _step(*a, **k),
        )[1]
    modules = list(experts.modules().values())
    trainer = Trainer.__new__(Trainer)
    waves = assignment.waves(cfg, 0, 1)
    trainer.__dict__.update(
        cfg=cfg,
        ctx=SimpleNamespace(world_size=1, rank=0, device=CPU, is_main=False, link=None, is_actor=False),
        model=model or StandInModel(),
        experts=experts,
        layout=experts.layout(),
        nft_old=WeightCopy(experts.params, modules) if g.algorithm == "nft" else None,
        ema=WeightCopy(experts.params, modules) if cfg.train.ema_decay is not None else None,
        scores=True,
        placement=offload.Placement(CPU, False, {}, {}),
        sigmas=sigmas,
        shift=shift,
        shape=tuple(shape),
        waves=waves,
        scorer=GivenRewards([rewards[j, m] for wave in waves for j, m in wave]),
        memory=PeakMemory(CPU),
        rolled_out=[],
        total=1,
        policy_version=0,
        feed=None,  # no rollout actors: the trainer rolls out itself
        resumed=None,
        refiners=None,  # no prompt refiners: the generator reads the samples' prompts
    )
    if old is not None:
        for copy_, name in zip(trainer.nft_old.copies, ("mix", "bias")):
            copy_.copy_(old[name])
    sets = []
    real_sets = _trace_sets(sets)
    with tempfile.TemporaryDirectory() as where:
        trainer.order = samples(g.prompts_per_step, Path(where))
        try:
            prepared = trainer.prepare(batch)
            trainer.update(replay.Action(batch, True, batch, 1, True), prepared)
        finally:
            real_sets()
    rows = [(j, m) for j in range(g.prompts_per_step) for m in range(g.group_size)]
    found = {
        (j, m): (chunk, i) for chunk in prepared.chunks for i, (j, m) in enumerate(zip(chunk.prompts, chunk.members))
    }
    pick = lambda field: torch.stack([getattr(found[r][0].trajectory, field)[found[r][1]] for r in rows])  # noqa: E731
    return {
        "trajectory": pick("latents"),
        "log_probs": pick("log_probs"),
        "means": pick("means") if g.grpo_guard else None,
        "advantages": torch.stack([found[r][0].advantages[found[r][1]] for r in rows]).view(g.prompts_per_step, -1),
        "sets": sets,
        "kept": torch.tensor([float(any(r in s for s in sets)) for r in rows]),
        "gradients": gradients,
        "trained": flat(experts.params),
        "ema": flat(trainer.ema.copies) if trainer.ema is not None else None,
        "old": flat(trainer.nft_old.copies) if trainer.nft_old is not None else None,
    }


def _trace_sets(sets: list):
    """Record the rows of each optimizer update the trainer takes (minibatches.update_sets, as it returns them);
    returns the undo."""
    from videogrpo.grpo import minibatches

    real = minibatches.update_sets

    def traced(g, seed, batch, rows=None):
        found = real(g, seed, batch, rows)
        sets.extend(sorted(r) if r is not None else minibatches.batch_rows(g) for _, r in found)
        return found

    minibatches.update_sets = traced

    def undo():
        minibatches.update_sets = real

    return undo
