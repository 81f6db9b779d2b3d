"""Which prompts and which group members each rank rolls out (docs/reference-system.md#grpo, shared-prompt mode),
the counters each rollout row's random draws are keyed by, and the topology a checkpoint's data position is
valid under (`dataloader_topology`).

The keys hold the global batch, the prompt's index in it and the group member, never a rank, a wave or a
chunk: a row draws the same noise and eta wherever it is rolled out, so tensor-parallel peers (which roll out
the same rows) agree, and a resumed run or another world size draws what an uninterrupted one would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from videogrpo.config import Config
from videogrpo.data.dataset import SampleRef
from videogrpo.provenance.digest import sha256_bytes


@dataclass(frozen=True)
class RankWork:
    """One rank's share of one wave: prompt slots (indices into the wave) and, per slot, group indices."""

    prompt_slots: tuple[int, ...]
    group_indices: tuple[int, ...]


def shared_prompt_work(rank: int, world: int, prompts_per_wave: int, group_size: int) -> RankWork:
    """Rank r's share of a wave of P prompts over W ranks. W a multiple of P (the reference's topology): rank r
    serves prompt r mod P as member r // P of k = W / P ranks, group indices range(r // P, G, k). W a divisor of
    P (fewer ranks than prompts): rank r serves the P / W prompts r, r + W, r + 2W, ... with every member of each
    group, one prompt after another; the update is the same (the loss is a global mean, every draw is keyed by
    prompt and member)."""
    if world < prompts_per_wave:
        if prompts_per_wave % world:
            raise ValueError(
                f"world size {world} neither divides nor is a multiple of the {prompts_per_wave} prompts per wave"
            )
        return RankWork(tuple(range(rank, prompts_per_wave, world)), tuple(range(group_size)))
    if world % prompts_per_wave:
        raise ValueError(f"world size {world} is not a multiple of the {prompts_per_wave} prompts per wave")
    ranks_per_prompt = world // prompts_per_wave
    if group_size % ranks_per_prompt:
        raise ValueError(
            f"group size {group_size} is not a multiple of the {ranks_per_prompt} ranks per prompt "
            f"(world size {world} / {prompts_per_wave} prompts per wave)"
        )
    member = rank // prompts_per_wave
    return RankWork((rank % prompts_per_wave,), tuple(range(member, group_size, ranks_per_prompt)))


def replica_work(rank: int, world: int, tensor_parallel: int, batch_size: int, group_size: int) -> RankWork:
    """Outside shared-prompt mode a data replica rolls out whole groups of its batch_size prompts, strided as
    the reference's distributed sampler deals them (docs/reference-system.md#a14b): replica r of R takes the batch's
    positions r, r + R, r + 2R, ...; both ranks of a TP pair (rank // tensor_parallel) take the same ones."""
    replicas = world // tensor_parallel
    replica = rank // tensor_parallel
    slots = tuple(range(replica, replicas * batch_size, replicas))
    return RankWork(slots, tuple(range(group_size)))


def waves(cfg: Config, rank: int, world: int) -> list[list[tuple[int, int]]]:
    """This rank's (prompt index in the batch, group member) rows, one list per wave: in shared-prompt mode one
    list per prompt the rank serves in each wave."""
    p = cfg.grpo
    if p.shared_prompts:
        size = p.prompts_per_wave or p.prompts_per_step
        work = shared_prompt_work(rank, world, size, p.group_size)
        # A rank with several prompts of a wave (fewer ranks than prompts) rolls them out one after another.
        return [
            [(w * size + slot, g) for g in work.group_indices]
            for w in range(p.prompts_per_step // size)
            for slot in work.prompt_slots
        ]
    work = replica_work(rank, world, cfg.parallel.tensor_parallel, cfg.train.batch_size, p.group_size)
    return [[(slot, g) for slot in work.prompt_slots for g in work.group_indices]]


def describe_share(rank_waves: list[list[tuple[int, int]]], rank: int) -> str:
    """What a rank rolls out per batch, as the trainer's first line says it."""
    prompts = len({j for wave in rank_waves for j, _ in wave})
    members = sum(len(wave) for wave in rank_waves) // prompts
    after = ", one after another" if len(rank_waves) > 1 else ""
    return f"rank {rank} rolls out {members} member(s) of each of {prompts} prompt(s) a batch{after}"


X_T_STEP = 0x1A17
"""The step counter of a row's initial noise x_T: far above any denoising step's, so never one of theirs."""
ETA_STREAM = 0xE7A
"""The counter that sets a prompt's eta draw (grpo.eta_range) apart from its noise draws."""


def init_noise_key(seed: int, batch: int, prompt: int, member: int, shared: bool) -> tuple[int, ...]:
    """x_T of a row: one per prompt when the group shares it (grpo.share_group_noise; member counter 0), else one
    per member (member + 1, so that no member's key is the shared one)."""
    return (seed, batch, prompt, 0 if shared else member + 1, X_T_STEP)


def step_noise_key(seed: int, batch: int, prompt: int, member: int, step: int) -> tuple[int, ...]:
    """eps of denoising step `step` of a row."""
    return (seed, batch, prompt, member, step)


def eta_key(seed: int, batch: int, prompt: int) -> tuple[int, ...]:
    """A prompt's eta (grpo.eta_range): one per prompt and batch, shared by its whole group."""
    return (seed, batch, prompt, ETA_STREAM)


def replica_seed(seed: int, rank: int, tensor_parallel: int) -> int:
    """The seed of a rank's global torch generator (for any draw not counter-keyed): one per data replica, so
    both ranks of a TP pair draw alike."""
    return seed + rank // tensor_parallel


def dataloader_topology(cfg: Config, world: int, order: list[SampleRef]) -> dict:
    """What a checkpoint's data position and per-rank state mean: the ranks, how prompts and group members
    are spread over them, and the training order the position indexes (train.reset_dataloader: false)."""
    p, par = cfg.grpo, cfg.parallel
    ids = json.dumps([[s.task, s.sample_id] for s in order]).encode()
    return {
        "world_size": world,
        "data_parallel": par.data_parallel,
        "shard_group_size": par.shard_group_size,
        "tensor_parallel": par.tensor_parallel,
        "shared_prompts": p.shared_prompts,
        "prompts_per_step": p.prompts_per_step,
        "prompts_per_wave": p.prompts_per_wave,
        "group_size": p.group_size,
        "batch_size": cfg.train.batch_size,
        "delayed_replay": p.delayed_replay,
        "training_samples": len(order),
        "training_order_sha256": sha256_bytes(ids),
    }


VALIDATION_STREAM = 0x7A1D
"""The counter that sets validation's draws (train.validate_*) apart: a key of four counters, where training's keys
have five, and another tag than evaluation's."""


def validation_noise_key(seed: int, prompt: int, step: int) -> tuple[int, ...]:
    """A validation prompt's draw: its x_T at step X_T_STEP, eps of denoising step `step`, its eta (a
    flowcps-uniform sampler) at ETA_STREAM. The same at every validation point and wherever the prompt is rolled
    out, so that validation points differ only by the weights."""
    return (seed, VALIDATION_STREAM, prompt, step)
