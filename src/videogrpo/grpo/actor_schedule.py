"""When rollout actors are dealt each batch, and under which weights (the `actors` section,
docs/options.md#rollout-actors): a pure function of the run's plan, so that a run's rollouts, and so its updates, are
the same whatever the actors' timing, and a resume deals what the uninterrupted run dealt.

The run is the plan's list of actions (`replay.plan`); an action that prepares a batch is a step to roll out. As in
the reference's asynchronous split loop, a step is created (dealt to the actors) while fewer than `prefetch` steps
separate it from the one the train ranks replay next, so step j is dealt once the actions before j - prefetch + 1
are done; and the weights it is rolled out under are those of the newest collection, which happens after every
`sync_interval`-th update (counted from update 0). Prefetch 1 and interval 1 are the synchronous mode: every batch
rolled out under the weights of the update just before it.

A batch's staleness is the updates its replay's weights have taken beyond the weights it was rolled out under: at
most prefetch - 1 + sync_interval - 1, one more under delayed replay (its replay follows the next batch's rollout).

May import `config` and the core modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from videogrpo.config.actors_section import auto_prefetch, prefetch  # noqa: F401 (re-exported: callers read the schedule's settings here)


@dataclass(frozen=True)
class Dispatch:
    action: int
    """The index of the action that prepares (replays, without actors) the batch."""
    batch: int
    at: int
    """The loop index it is dealt at: after the actions before `at` are done (their updates taken)."""
    version: int
    """The updates the weights it is rolled out under have taken (their policy version)."""


def sync_interval(cfg) -> int:
    return cfg.actors.sync_interval if cfg.actors.asynchronous else 1


def updates_before(actions) -> list[int]:
    """done[k]: the updates taken before loop index k (k = 0 .. len(actions))."""
    done = [0]
    for action in actions:
        done.append(action.update if action.update is not None else done[-1])
    return done


def schedule(actions, prefetch: int, interval: int) -> list[Dispatch]:
    """Every batch the plan prepares: when it is dealt and under which weights' version."""
    done = updates_before(actions)
    out = []
    for j, action in enumerate(actions):
        if not action.prepare:
            continue
        at = max(0, j - prefetch + 1)
        out.append(Dispatch(j, action.batch, at, done[at] - done[at] % interval))
    return out


def staleness_bound(prefetch: int, interval: int, delayed_replay: bool) -> int:
    return prefetch - 1 + interval - 1 + int(delayed_replay)


def versions_kept(dispatches: list[Dispatch], done: list[int], after: int) -> set[int]:
    """The weights' versions that the batches dealt from loop index `after` on, or dealt before it and not yet
    prepared, are rolled out under, other than the current weights' (done[after]): what a checkpoint taken before
    loop index `after` keeps so that a resume deals those batches under the same weights."""
    return {d.version for d in dispatches if d.action >= after and d.version < done[after]}


def describe(cfg) -> str:
    if not cfg.actors.asynchronous:
        return "synchronous"
    p, i = prefetch(cfg), sync_interval(cfg)
    bound = staleness_bound(p, i, cfg.grpo.delayed_replay)
    return f"asynchronous, prefetch {p}, weights collected every {i} update(s), staleness at most {bound}"
