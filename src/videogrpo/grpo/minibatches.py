"""Several optimizer updates per rollout batch (grpo.updates_per_batch, grpo.update_passes; docs/options.md#several-
updates-per-batch): which of a batch's rows each update trains, and the replay forwards a rank runs for it
(`objectives.replay_update` runs them).

A pass splits the batch's rows, (prompt slot, group member) pairs, into `updates_per_batch` sets of equal size, one
optimizer update each: `shuffled` takes consecutive slices of a seeded permutation of all rows, keyed by the batch and
the pass (prompts mixed, as GRPO-Guard's and DiffusionNFT's authors shuffle their samples); `by_member` gives update
m members [m G / U, (m + 1) G / U) of every prompt (MixGRPO's: each update takes 3 of a prompt's 12 samples). The
sets are made of the batch's rows, not of one rank's, so the updates are the same at every world size. Every update
takes its ratio against the rollout's log-probabilities, so only a batch's first update is on-policy.

A rank replays its rows of a set chunk by chunk, at most grpo.sample_batch_size members of each prompt at a time, as
it rolled them out (the memory plan's replay chunk). Under a sharded layout every rank must run as many forwards as
every other (each forward all-gathers, each backward reduce-scatters); a rank with fewer rows in a set pads with
forwards of weight 0 on a row of its own. With one update per batch (the reference) the set is every row, the
forwards are the rollout's chunks and nothing is padded. With grpo.drop_zero_advantage the sets are made of the
rows whose advantage is not 0 (`kept_rows`): the others are not replayed at all.

May import `grpo.assignment`, `grpo.offload`, `grpo.draws`, `config` and the core modules (the planner counts
the forwards with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from videogrpo.grpo import assignment, offload
from videogrpo.grpo.draws import counter_seed

ORDER_TAG = 0x0DE5
"""The draw of a pass's permutation of a batch's rows (update_order shuffled)."""
REFILL_TAG = 0x2E0
"""The draw of the zero-advantage rows put back (drop_zero_advantage)."""

Row = tuple[int, int]


def updates_per_step(g) -> int:
    """Optimizer updates per replayed batch: updates_per_batch in each of update_passes passes."""
    return g.updates_per_batch * g.update_passes


def batch_rows(g) -> list[Row]:
    """Every (prompt slot, member) of a batch, in order."""
    return [(j, m) for j in range(g.prompts_per_step) for m in range(g.group_size)]


def kept_rows(g, seed: int, batch: int, advantages) -> list[Row]:
    """grpo.drop_zero_advantage: the rows whose advantage is not exactly 0 ([P, G] advantages), and, where their
    count is not a multiple of updates_per_batch (or is 0), seeded zero-advantage rows put back until it is, as its
    authors' code refills its mini-batches; in batch order."""
    rows = batch_rows(g)
    kept = [r for r in rows if float(advantages[r]) != 0.0]
    short = -len(kept) % g.updates_per_batch if kept else g.updates_per_batch
    if short:
        zero = [r for r in rows if float(advantages[r]) == 0.0]
        order = np.random.default_rng(counter_seed(seed, REFILL_TAG, batch)).permutation(len(zero))
        kept += [zero[i] for i in order[:short]]
    return sorted(kept)


def update_sets(g, seed: int, batch: int, rows: list[Row] | None = None) -> list[tuple[int, frozenset[Row] | None]]:
    """(pass, rows) of each optimizer update of batch `batch`, in order, over `rows` (kept_rows), else the whole
    batch; rows None: every row of the batch (one update a pass over the whole batch)."""
    if g.updates_per_batch == 1:
        return [(p, None if rows is None else frozenset(rows)) for p in range(g.update_passes)]
    rows = batch_rows(g) if rows is None else rows
    sets = []
    for p in range(g.update_passes):
        if g.update_order == "by_member":
            size = g.group_size // g.updates_per_batch
            sets += [(p, frozenset(r for r in rows if r[1] // size == k)) for k in range(g.updates_per_batch)]
            continue
        order = np.random.default_rng(counter_seed(seed, ORDER_TAG, batch, p)).permutation(len(rows))
        size = len(rows) // g.updates_per_batch
        sets += [(p, frozenset(rows[i] for i in order[k * size : (k + 1) * size])) for k in range(g.updates_per_batch)]
    return sets


@dataclass(frozen=True)
class Forward:
    chunk: int
    """Index of the rollout chunk (wave) in the prepared batch."""
    at: list[int]
    """Its rows this forward replays."""
    weight: int
    """1, or 0 for a padding forward: run for the collectives, counted nowhere."""


def chunk_forwards(rank_waves: list[list[Row]], rows: frozenset[Row] | None, members: int | None) -> list[Forward]:
    """A rank's replay forwards of `rows` (None: all its rows), wave by wave, `members` members of each prompt at a
    time (grpo.sample_batch_size; None: the wave's rows of the set at once)."""
    found = []
    for c, wave in enumerate(rank_waves):
        picked = [i for i, row in enumerate(wave) if rows is None or row in rows]
        if picked:
            found += [
                Forward(c, [picked[i] for i in part], 1)
                for part in offload.rollout_chunks([wave[i] for i in picked], members)
            ]
    return found


def rank_forwards(cfg, rank_waves: list[list[Row]], world: int, rows: frozenset[Row] | None) -> list[Forward]:
    """This rank's forwards of an update, padded under a sharded layout to the most any rank runs."""
    members = cfg.grpo.sample_batch_size
    forwards = chunk_forwards(rank_waves, rows, members)
    if rows is None or cfg.parallel.data_parallel == "replicate":  # replicate: one all-reduce, at the step
        return forwards
    most = max(len(chunk_forwards(assignment.waves(cfg, r, world), rows, members)) for r in range(world))
    return forwards + [Forward(0, [0], 0)] * (most - len(forwards))
