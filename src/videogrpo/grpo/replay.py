"""The schedule of rollouts and updates: synchronous, or one-step-delayed replay (REFERENCE section 4).

The trainer runs exactly the actions `plan` returns, and the number of optimizer updates of a run
(what the LR schedule and the ETA use) is read off the same plan, so the two cannot disagree.

Delayed replay keeps one prepared batch (rollouts whose rewards are still being scored) in a slot:
- slot empty, no flush due: prepare this batch into the slot, no update (prefill);
- no flush due: prepare this batch, then replay the slot's batch and update (one update stale);
  this batch takes the slot;
- flush due: prepare this batch, then replay the slot's batch and this one in a single update, which
  leaves the slot empty.
A flush is due when the next update's number is a multiple of save_steps, reaches max_steps, or
when the batch is the last of its epoch, so that checkpoints, epoch ends and the end of the run never
hold prepared work. (The reference text says "replay what is pending and leave the slot empty" for a
flush; replaying the current batch in the same update is our reading: the flushing update keeps its
number, which is what makes checkpoints land on multiples of save_steps, and no batch is dropped.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    batch: int
    """Global batch index to prepare (roll out and submit for scoring): epoch * per_epoch + index."""
    replay: tuple[int, ...]
    """Batches replayed in this action's update, oldest first (empty: a prefill, no update)."""
    update: int | None
    """Number of the optimizer update this action makes (1-based), or None."""
    flush: bool
    """The slot is empty after this action (a checkpoint may follow)."""
    staleness: float = 0.0
    """Mean number of updates the policy made between rolling out and replaying the replayed batches."""


def plan(batches_per_epoch: int, epochs: int, save_steps: int, max_steps: int | None,
         delayed: bool) -> list[Action]:
    """Every action of a run, in order; the run ends after the update numbered max_steps (if set)."""
    if batches_per_epoch < 1 or epochs < 1 or save_steps < 1:
        raise ValueError(f"batches_per_epoch {batches_per_epoch}, epochs {epochs}, save_steps {save_steps} must be >= 1")
    actions: list[Action] = []
    updates = 0
    slot: int | None = None
    prepared_after: dict[int, int] = {}  # batch -> updates made before it was rolled out

    def stale(replayed: tuple[int, ...]) -> float:
        # Replayed in update `updates` (already counted), with the policy after `updates - 1` updates.
        return sum(updates - 1 - prepared_after[b] for b in replayed) / len(replayed)

    for batch in range(batches_per_epoch * epochs):
        if max_steps is not None and updates >= max_steps:
            break
        prepared_after[batch] = updates
        if not delayed:
            updates += 1
            actions.append(Action(batch, (batch,), updates, True, stale((batch,))))
            continue
        nxt = updates + 1
        last_of_epoch = (batch + 1) % batches_per_epoch == 0
        flush = nxt % save_steps == 0 or (max_steps is not None and nxt >= max_steps) or last_of_epoch
        if slot is None and not flush:
            slot = batch
            actions.append(Action(batch, (), None, False))
        elif not flush:
            updates += 1
            actions.append(Action(batch, (slot,), updates, False, stale((slot,))))
            slot = batch
        else:
            updates += 1
            replayed = ((slot,) if slot is not None else ()) + (batch,)
            actions.append(Action(batch, replayed, updates, True, stale(replayed)))
            slot = None
    return actions


def total_updates(actions: list[Action]) -> int:
    return sum(1 for a in actions if a.update is not None)


def should_checkpoint(action: Action, save_steps: int, total: int) -> bool:
    return action.update is not None and action.flush and (action.update % save_steps == 0 or action.update == total)
