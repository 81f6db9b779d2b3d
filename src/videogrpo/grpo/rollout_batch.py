"""A batch of rollouts, as the trainer receives it: this rank's share of each wave's prompts and members rolled out
(encode, the keyed draws, the rollout chunk by chunk, the records parked where offload says), decoded and submitted to
the reward scorer (`prepare`); later, its rewards collected and gathered over the ranks and its group-relative
advantages set (`advantages`). Functions of the trainer's state, as the objectives are: the trainer's loop calls them
and never grows a branch of its own for how a batch is made.

May import: `grpo` modules below the trainer, `rewards`, `models`, `data`, `parallel` and the core modules.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from videogrpo.data.dataset import SampleRef, batch_for_step
from videogrpo.grpo import assignment, offload, refiners, sde_window
from videogrpo.grpo.advantages import group_advantages, shuffled_within_groups, zero_variance_groups
from videogrpo.grpo.draws import seeded_normal, seeded_uniform
from videogrpo.grpo.rollout import Trajectory, rollout
from videogrpo.parallel import process_groups
from videogrpo.rewards.rule import score_request
from videogrpo.rewards.terms import term_means


@dataclass
class Chunk:
    """One wave of this rank's rollouts: which (prompt, member) each row is, and what was recorded."""

    prompts: list[int]
    members: list[int]
    samples: list[SampleRef]
    trajectory: Trajectory
    embeds: torch.Tensor
    condition: torch.Tensor | None = None
    """The I2V condition (mask and first-frame latent) replay feeds again; None for TI2V (its frame 0 is pinned in
    the recorded latents)."""
    futures: list = field(default_factory=list)
    advantages: torch.Tensor | None = None
    rewrites: list | None = None
    """With prompt refiners: each row's rewrites in expert order (refiners.Rewrite; [] where the member keeps the
    sample's prompt); None without them."""


@dataclass
class Prepared:
    batch: int
    epoch: int
    chunks: list[Chunk]
    time_rollout_s: float
    policy_version: int = 0
    """The updates the weights it was rolled out under had taken."""


def prepare(trainer, batch_index: int, receive=None, version: int | None = None) -> Prepared:
    """This rank's chunks of batch `batch_index`: rolled out wave by wave and submitted for scoring, or with rollout
    actors `receive(trainer, batch_index, prompts)`'s (actors.Feed.receive: rolled out and scored by them, under the
    weights of `version`)."""
    t0 = time.monotonic()
    trainer.memory.enter("rollout")
    epoch, prompts = batch_for_step(trainer.order, trainer.cfg.grpo.prompts_per_step, batch_index)
    if receive is not None:
        chunks = receive(trainer, batch_index, prompts)
    else:
        chunks = [rollout_wave(trainer, batch_index, prompts, rows) for rows in trainer.waves]
    trainer.rolled_out.append(batch_index)
    version = trainer.policy_version if version is None else version
    return Prepared(batch_index, epoch, chunks, time.monotonic() - t0, version)


def rollout_wave(trainer, batch_index: int, prompts: list[SampleRef], rows: list[tuple[int, int]]) -> Chunk:
    cfg = trainer.cfg
    samples = [prompts[j] for j, _ in rows]
    texts, rewrites = [s.prompt for s in samples], None
    if trainer.refiners is not None:  # the generator reads the rewrites; the scorer the sample's own prompt and task
        texts, rewrites = trainer.refiners.rewrite_rows(batch_index, rows, texts, [s.first_frame for s in samples])
    trainer.placement.enter("encode")
    embeds, condition = trainer.model.encode_conditions(
        texts,
        [s.first_frame for s in samples],
        cfg.video.height,
        cfg.video.width,
        cfg.video.num_frames,
    )
    trainer.placement.enter("rollout")
    positions = offload.rollout_chunks(rows, cfg.grpo.sample_batch_size)
    parts = []
    for at in positions:  # each chunk's record goes to CPU before the next chunk rolls out (when offloading)
        parts.append(
            trainer.placement.park(
                rollout_chunk(trainer, batch_index, [rows[i] for i in at], embeds[at], condition[at])
            )
        )
    trajectory = offload.assemble(parts, positions)
    chunk = Chunk(
        [j for j, _ in rows],
        [g for _, g in rows],
        samples,
        trajectory,
        trainer.placement.park_tensor(embeds),
        None if trainer.model.pins_first_frame else trainer.placement.park_tensor(condition),
        rewrites=rewrites,
    )
    if not trainer.scores:  # a TP peer: its tp_rank 0 decodes and scores the same rollouts
        return chunk
    trainer.placement.enter("decode")
    videos = offload.decode_in_batches(trainer.model.decode, trajectory.latents[:, -1], cfg.grpo.decode_batch_size)
    chunk.futures = [
        trainer.scorer.submit(score_request(cfg.evalkit, cfg.video.fps, v, s.task, str(s.directory)))
        for v, s in zip(videos, samples)
    ]
    return chunk


def rollout_chunk(trainer, batch_index: int, rows: list[tuple[int, int]], embeds, condition) -> Trajectory:
    cfg, dev, seed, b = trainer.cfg, trainer.ctx.device, trainer.cfg.train.seed, batch_index
    # Draws are keyed by batch, prompt and member (assignment): independent of ranks, waves, chunks and resumes.
    shared = cfg.grpo.share_group_noise
    init = torch.stack(
        [seeded_normal(trainer.shape, dev, *assignment.init_noise_key(seed, b, j, g, shared)) for j, g in rows]
    )
    if cfg.grpo.eta_range:
        lo, hi = cfg.grpo.eta_range
        etas = torch.tensor([seeded_uniform(lo, hi, *assignment.eta_key(seed, b, j)) for j, _ in rows], device=dev)
    else:
        etas = torch.full((len(rows),), cfg.grpo.eta, device=dev)

    def step_noise(i: int) -> torch.Tensor:
        return torch.stack(
            [seeded_normal(trainer.shape, dev, *assignment.step_noise_key(seed, b, j, g, i)) for j, g in rows]
        )

    sampling = trainer.nft_old.swapped_in() if trainer.nft_old is not None else contextlib.nullcontext()
    window = sde_window.window(cfg.grpo, seed, b)
    with torch.no_grad(), sampling:
        return rollout(
            trainer.model,
            trainer.experts.policy,
            embeds,
            condition,
            init,
            trainer.sigmas,
            cfg.grpo.sampler,
            etas,
            step_noise,
            cfg.grpo.guidance_scale,
            window,
            keep_means=cfg.grpo.grpo_guard,
            tail=sde_window.tail(cfg.grpo, trainer.shift, window),
        )


def advantages(trainer, prepared: Prepared) -> dict:
    """Collect this rank's rewards, gather every rank's, set each chunk's advantages; reward stats."""
    mine = []
    for chunk in prepared.chunks:
        results = trainer.scorer.collect(chunk.futures)
        mine += [
            (j, g, r["score"], s.task, bool(r.get("error")), r.get("terms"))
            for j, g, r, s in zip(chunk.prompts, chunk.members, results, chunk.samples)
        ]
    everyone = [row for part in process_groups.all_gather_objects(mine) for row in part]
    table = torch.full((trainer.cfg.grpo.prompts_per_step, trainer.cfg.grpo.group_size), float("nan"))
    for j, g, score, *_ in everyone:
        table[j, g] = score
    if torch.isnan(table).any():
        raise RuntimeError("some group members got no reward: the rank assignment does not cover every group")
    g = trainer.cfg.grpo
    adv = group_advantages(table, g.advantage_std, g.advantage_std_unbiased, g.advantage_eps)
    if trainer.refiners is not None and trainer.cfg.refiners.credit == "hierarchical":  # a video's group: its rewrite's
        adv = refiners.generator_advantages(trainer.cfg, table)
    if trainer.cfg.grpo.shuffle_advantages:
        adv = shuffled_within_groups(adv, trainer.cfg.train.seed, prepared.batch)
    for chunk in prepared.chunks:
        chunk.advantages = torch.stack([adv[j, g] for j, g in zip(chunk.prompts, chunk.members)]).to(trainer.ctx.device)
    per_task: dict[str, list[float]] = {}
    for _, _, score, task, *_ in everyone:
        per_task.setdefault(task, []).append(score)
    errors = sum(row[4] for row in everyone)
    terms = term_means([row[5] for row in everyone])  # reward.terms: each term's raw mean
    # grpo.skip_zero_variance_groups: such groups contribute no loss (docs/options.md#groups-without-signal).
    skipped = zero_variance_groups(table) if trainer.cfg.grpo.skip_zero_variance_groups else None
    refiner_advantages = None
    if trainer.refiners is not None:  # each refiner's advantages: the generator's, or its own reward term's
        term_tables = {}
        for j, g, _, _, _, scored in everyone:
            for kind, value in (scored or {}).items():
                term_tables.setdefault(kind, torch.full_like(table, float("nan")))[j, g] = value
        refiner_advantages = refiners.advantages(trainer.cfg, table, adv, term_tables)
    return {
        "refiner_advantages": refiner_advantages,
        "rewards": table,
        "advantages": adv,
        "per_task": per_task,
        "errors": errors,
        "terms": terms,
        "skipped": skipped,
    }
