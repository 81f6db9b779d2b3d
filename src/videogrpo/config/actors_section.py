"""The `actors` section of the config: rollout actor ranks (docs/options.md#rollout-actors). Off by default: every
rank rolls out, scores and trains, as the released recipes. On, the first ranks of the job train and the others
roll out and score for them. Its own module so that the sections stay legible; `config.sections` assembles it into
the Config.

May import: the core modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WEIGHT_SYNCS = ("auto", "lora", "full", "none")


@dataclass
class ActorsConfig:
    train_ranks: int = 0
    """Ranks that train when the others are rollout actors: the first `train_ranks` global ranks train (replaying,
    data-parallel, as a job of that many ranks would), the rest roll out and score the batches for them. 0 (with
    train_nodes 0): no actors, every rank rolls out and trains (the released recipes)."""
    train_nodes: int = 0
    """The train ranks by whole nodes: the first `train_nodes` x parallel.procs_per_node ranks (0: train_ranks
    decides). Set one of the two."""
    weight_sync: str = "auto"
    """How the train ranks send the policy to the actors, only to an actor whose weights are behind: `lora` (the
    adapters only), `full` (every trained tensor, one at a time), `none` (never: the actors keep the initial
    weights, a plumbing smoke whose updates are off-policy), `auto` (lora under LoRA, else full)."""
    asynchronous: bool = False
    """Actors roll out batches ahead of the update that replays them (bounded by `prefetch`), so rollouts overlap
    training; false: each batch is rolled out under the weights of the update before it, the same updates as
    without actors."""
    prefetch: int | None = None
    """Asynchronous mode: batches an actor may roll out ahead of the update that replays them; null: the
    reference's max(1, ceil(actors / max(1, ceil(G / S))) + 1), S grpo.sample_batch_size (G when null)."""
    sync_interval: int = 1
    """Asynchronous mode: updates between two collections of the weights the actors are sent."""
    stall_timeout_s: float = 600.0
    """Seconds a train rank waits for an actor's rollouts (or an actor for its next job) before it stops the run with
    an error naming the actor's rank and node."""


def prefetch(cfg) -> int:
    """Batches dealt ahead to the actors: 1 when synchronous; else actors.prefetch, or the automatic one (a Config:
    its actor ranks are the ranks beside cfg.train_world_size)."""
    a, g = cfg.actors, cfg.grpo
    if not a.asynchronous:
        return 1
    return a.prefetch or auto_prefetch(cfg.world_size - cfg.train_world_size, g.group_size, g.sample_batch_size)


def auto_prefetch(actor_ranks: int, group_size: int, sample_batch_size: int | None) -> int:
    """The reference's automatic prefetch: one step more than the steps the actors can hold at once, each step being
    ceil(G / S) jobs of up to S group members (S: grpo.sample_batch_size, G when null)."""
    jobs_per_step = max(1, math.ceil(group_size / (sample_batch_size or group_size)))
    return max(1, math.ceil(actor_ranks / jobs_per_step) + 1)
