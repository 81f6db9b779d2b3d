"""The delayed-replay state machine (docs/reference-system.md#grpo)."""

import pytest

from videogrpo.grpo.replay import describe, plan, should_checkpoint, total_updates


def updates_of(actions):
    return [a for a in actions if a.update is not None]


def test_synchronous_plan_updates_on_every_batch():
    actions = plan(batches_per_epoch=4, epochs=2, save_steps=3, max_steps=None, delayed=False)
    assert [a.replay for a in actions] == list(range(8)) and all(a.prepare and a.flush for a in actions)
    assert total_updates(actions) == 8 and all(a.staleness == 0 for a in actions)
    assert [a.update for a in actions if should_checkpoint(a, 3, 8)] == [3, 6, 8]


def test_delayed_plan_prefills_then_runs_one_update_stale():
    actions = plan(batches_per_epoch=10, epochs=1, save_steps=100, max_steps=None, delayed=True)
    first, second, third = actions[:3]
    assert first.prepare and first.replay is None and first.update is None  # prefill
    # Batch 0 was rolled out before any update and replayed in update 1: the policy had not moved yet.
    assert second.replay == 0 and second.update == 1 and second.staleness == 0
    assert third.replay == 1 and third.update == 2 and third.staleness == 1
    steady = [a for a in updates_of(actions) if not a.flush][1:]
    assert steady and all(a.staleness == 1 and a.prepare for a in steady)


def test_a_flush_with_a_pending_batch_replays_only_it_and_skips_the_current_batch():
    """The reference's flush: the slot's batch is replayed alone; the data batch of that step is never rolled out."""
    actions = plan(batches_per_epoch=5, epochs=2, save_steps=100, max_steps=None, delayed=True)
    end_of_first = actions[4]
    assert end_of_first.batch == 4 and not end_of_first.prepare
    assert end_of_first.replay == 3 and end_of_first.flush and end_of_first.staleness == 1
    assert actions[5].prepare and actions[5].update is None  # the next epoch prefills again
    assert total_updates(actions) == 8  # 2 x (1 prefill + 3 steady + 1 flush); batches 4 and 9 skipped
    skipped = [a.batch for a in actions if not a.prepare]
    assert skipped == [4, 9]


def test_a_flush_with_an_empty_slot_rolls_out_and_replays_synchronously():
    # save_steps 1: every update flushes, so the slot is always empty at a flush.
    actions = plan(batches_per_epoch=3, epochs=1, save_steps=1, max_steps=None, delayed=True)
    assert [(a.prepare, a.replay, a.update, a.staleness) for a in actions] == [
        (True, 0, 1, 0.0),
        (True, 1, 2, 0.0),
        (True, 2, 3, 0.0),
    ]


def test_delayed_plan_drains_before_every_checkpoint():
    actions = plan(batches_per_epoch=50, epochs=1, save_steps=4, max_steps=None, delayed=True)
    saves = [a for a in actions if should_checkpoint(a, 4, total_updates(actions))]
    assert [a.update for a in saves][:3] == [4, 8, 12]
    for a in saves:
        assert a.flush  # nothing prepared is pending when a checkpoint is written
        following = actions[actions.index(a) + 1] if a is not actions[-1] else None
        assert following is None or following.update is None  # after a drain the slot refills first


def test_save_steps_zero_means_no_periodic_checkpoint():
    actions = plan(batches_per_epoch=20, epochs=1, save_steps=0, max_steps=None, delayed=True)
    total = total_updates(actions)
    assert total == 19  # a prefill, 18 steady updates, the epoch-end flush (replays batch 18, skips batch 19)
    assert [a.update for a in actions if should_checkpoint(a, 0, total)] == [total]  # only the end of the run


def test_delayed_plan_stops_at_max_steps_with_the_slot_empty():
    actions = plan(batches_per_epoch=100, epochs=3, save_steps=1000, max_steps=7, delayed=True)
    assert total_updates(actions) == 7 and actions[-1].update == 7 and actions[-1].flush


@pytest.mark.parametrize(
    "per_epoch,epochs,save,max_steps",
    [(1, 3, 1, None), (2, 2, 1, None), (7, 3, 5, 11), (3, 1, 2, None), (16, 5, 100, None), (9, 2, 0, None)],
)
def test_every_update_replays_exactly_one_rolled_out_batch_and_skipped_ones_never(per_epoch, epochs, save, max_steps):
    actions = plan(per_epoch, epochs, save, max_steps, delayed=True)
    rolled_out = [a.batch for a in actions if a.prepare]
    replayed = [a.replay for a in updates_of(actions)]
    assert sorted(replayed) == rolled_out  # each rolled-out batch replayed exactly once, nothing else
    assert not {a.batch for a in actions if not a.prepare} & set(replayed)
    assert [a.update for a in updates_of(actions)] == list(range(1, total_updates(actions) + 1))
    assert [a.batch for a in actions] == list(range(len(actions)))  # every action consumes the next batch


def test_the_5b_recipes_make_7728_updates_in_five_epochs_of_1562_batches():
    actions = plan(batches_per_epoch=1562, epochs=5, save_steps=100, max_steps=None, delayed=True)
    assert total_updates(actions) == 7728
    assert len(actions) == 1562 * 5


def test_the_run_length_names_the_limit_that_set_it():
    """The trainer's first line says which limit ended the run and why, so that `max_steps: 8` running 6 updates
    is explained, not silent."""
    longer = describe(plan(6, 1, 0, 8, False), 6, 1, 8, False)
    assert longer.startswith("6 updates in 6 batches (synchronous): train.epochs = 1 x 6 batches per epoch = 6")
    assert "end the run before train.max_steps = 8" in longer and "raise train.epochs" in longer
    shorter = describe(plan(6, 1, 0, 4, False), 6, 1, 4, False)
    assert shorter.startswith("4 updates in 4 batches (synchronous): train.max_steps = 4 ends the run there")
    assert describe(plan(6, 2, 0, None, False), 6, 2, None, False).endswith("train.max_steps not set")
    delayed = describe(plan(4, 2, 0, None, True), 4, 2, None, True)
    assert delayed.startswith("6 updates in 8 batches (delayed replay)"), delayed
    assert "2 batch(es) only fill the slot and 2 are skipped by a flush" in delayed
