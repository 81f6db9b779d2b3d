"""The schedule of rollouts and updates: synchronous, or one-step-delayed replay (docs/reference-system.md#grpo).

The trainer runs exactly the actions `plan` returns, and the number of optimizer updates of a run
(what the LR schedule and the ETA use) is read off the same plan, so the two cannot disagree.

Every action consumes one data batch. Delayed replay keeps one prepared batch (rollouts whose
rewards are still being scored) in a slot:
- slot empty, no flush due: roll out this batch into the slot, no update (prefill);
- slot full, no flush due: roll out this batch, then replay the slot's batch and update (one update
  stale); this batch takes the slot;
- slot full, flush due: replay the slot's batch and update, leaving the slot empty; this data batch
  is skipped, never rolled out (the reference's behaviour: its own tests call it "unused");
- slot empty, flush due: roll out this batch and replay it at once (synchronous, not stale).
A flush is due when the next update's number is a multiple of save_steps (0: never), reaches
max_steps, or when the batch is the last of its epoch, so that checkpoints, epoch ends and the end of
the run never hold prepared work. Every update replays exactly one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from videogrpo.errors import ConfigError


@dataclass(frozen=True)
class Action:
    batch: int
    """Global index of the data batch this action consumes: epoch * per_epoch + index."""
    prepare: bool
    """Roll out `batch` and submit it for scoring (False: the batch is skipped by a flush)."""
    replay: int | None
    """The batch replayed in this action's update (None: a prefill, no update)."""
    update: int | None
    """Number of the optimizer update this action makes (1-based), or None."""
    flush: bool
    """The slot is empty after this action (a checkpoint may follow)."""
    staleness: float = 0.0
    """Updates the policy made between rolling out the replayed batch and replaying it."""


def plan(batches_per_epoch: int, epochs: int, save_steps: int, max_steps: int | None, delayed: bool) -> list[Action]:
    """Every action of a run, in order; the run ends after the update numbered max_steps (if set)."""
    if batches_per_epoch < 1 or epochs < 1 or save_steps < 0:
        raise ValueError(
            f"batches_per_epoch {batches_per_epoch}, epochs {epochs} must be >= 1 and save_steps {save_steps} >= 0"
        )
    actions: list[Action] = []
    updates = 0
    slot: int | None = None
    rolled_out_after: dict[int, int] = {}  # batch -> updates made before it was rolled out

    for batch in range(batches_per_epoch * epochs):
        if max_steps is not None and updates >= max_steps:
            break
        nxt = updates + 1
        if not delayed:
            actions.append(Action(batch, True, batch, nxt, True, 0.0))
            updates = nxt
            continue
        last_of_epoch = (batch + 1) % batches_per_epoch == 0
        flush = (
            (save_steps > 0 and nxt % save_steps == 0) or (max_steps is not None and nxt >= max_steps) or last_of_epoch
        )
        if slot is None:
            rolled_out_after[batch] = updates
            if not flush:
                actions.append(Action(batch, True, None, None, False))
                slot = batch
                continue
            actions.append(Action(batch, True, batch, nxt, True, 0.0))
        elif flush:
            actions.append(Action(batch, False, slot, nxt, True, float(updates - rolled_out_after[slot])))
            slot = None
        else:
            rolled_out_after[batch] = updates
            actions.append(Action(batch, True, slot, nxt, False, float(updates - rolled_out_after[slot])))
            slot = batch
        updates = nxt
    return actions


def total_updates(actions: list[Action]) -> int:
    return sum(1 for a in actions if a.update is not None)


def should_checkpoint(action: Action, save_steps: int, total: int) -> bool:
    """After a flushing update at a multiple of save_steps (0: none), and after the run's last update."""
    if action.update is None or not action.flush:
        return False
    return (save_steps > 0 and action.update % save_steps == 0) or action.update == total


def describe(actions: list[Action], batches_per_epoch: int, epochs: int, max_steps: int | None, delayed: bool) -> str:
    """The run's length as the log states it at the start, with the limit that set it and why: `train.max_steps`
    when it cuts the run short, the epochs when they end it before `max_steps`, and under delayed replay the
    batches that make no update of their own."""
    total, batches = total_updates(actions), batches_per_epoch * epochs
    mode = "delayed replay" if delayed else "synchronous"
    epochs_give = f"train.epochs = {epochs} x {batches_per_epoch} batches per epoch = {batches} batches"
    if max_steps is not None and total >= max_steps:
        why = f"train.max_steps = {max_steps} ends the run there ({epochs_give})"
    elif max_steps is not None:
        why = (
            f"{epochs_give} end the run before train.max_steps = {max_steps} (raise train.epochs for more updates; "
            f"max_steps only ever shortens a run)"
        )
    else:
        why = f"{epochs_give}; train.max_steps not set"
    if delayed and total < len(actions):
        prefills = sum(1 for a in actions if a.update is None)
        skipped = sum(1 for a in actions if not a.prepare)
        why += (
            f"; under delayed replay {prefills} batch(es) only fill the slot and {skipped} are skipped by a flush "
            f"before a checkpoint or an epoch end, so {len(actions)} batches make {total} updates"
        )
    return f"{total} updates in {len(actions)} batches ({mode}): {why}"


def check_position(actions: list[Action], source, state: dict) -> None:
    """A checkpoint's position (`state`, read from `source`) is a flushed update of this run's replay plan `actions`
    (same number, same batch); ConfigError otherwise."""
    after = state.get("next_action", 0) - 1
    action = actions[after] if 0 <= after < len(actions) else None
    if action is None or not action.flush or action.update != state.get("update"):
        where = f"update {action.update} (flush: {action.flush})" if action else "no action"
        raise ConfigError(
            f"{source}: written after update {state.get('update')} at batch {after}, where this run's replay "
            f"plan has {where} (train.epochs, save_steps, max_steps or grpo.delayed_replay differ); set "
            f"train.reset_dataloader: true to take its weights only"
        )
