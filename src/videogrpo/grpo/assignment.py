"""Which prompts and which group members each rank rolls out (docs/reference-system.md#grpo, shared-prompt mode)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankWork:
    """One rank's share of one wave: prompt slots (indices into the wave) and, per slot, group indices."""

    prompt_slots: tuple[int, ...]
    group_indices: tuple[int, ...]


def shared_prompt_work(rank: int, world: int, prompts_per_wave: int, group_size: int) -> RankWork:
    """Rank r serves prompt r mod P as member r // P of k = W / P ranks: group indices range(r // P, G, k)."""
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
