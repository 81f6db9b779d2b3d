"""The delayed-replay state machine (REFERENCE section 4)."""

import pytest

from videogrpo.grpo.replay import plan, should_checkpoint, total_updates


def test_synchronous_plan_updates_on_every_batch():
    actions = plan(batches_per_epoch=4, epochs=2, save_steps=3, max_steps=None, delayed=False)
    assert [a.replay for a in actions] == [(b,) for b in range(8)]
    assert total_updates(actions) == 8 and all(a.staleness == 0 for a in actions)
    assert [a.update for a in actions if should_checkpoint(a, 3, 8)] == [3, 6, 8]


def test_delayed_plan_prefills_then_runs_one_update_stale():
    actions = plan(batches_per_epoch=10, epochs=1, save_steps=100, max_steps=None, delayed=True)
    first, second, third = actions[:3]
    assert first.replay == () and first.update is None  # prefill
    # Batch 0 was rolled out before any update and replayed in update 1: the policy had not moved yet.
    assert second.replay == (0,) and second.update == 1 and second.staleness == 0
    assert third.replay == (1,) and third.update == 2 and third.staleness == 1
    steady = [a for a in actions if a.update is not None and not a.flush][1:]
    assert steady and all(a.staleness == 1 for a in steady)
    merged = actions[-1]
    assert merged.flush and len(merged.replay) == 2 and merged.staleness == 0.5


def test_delayed_plan_drains_at_epoch_end():
    actions = plan(batches_per_epoch=5, epochs=2, save_steps=100, max_steps=None, delayed=True)
    end_of_first = actions[4]
    assert end_of_first.batch == 4 and end_of_first.replay == (3, 4) and end_of_first.flush
    assert actions[5].replay == () and actions[5].update is None  # the next epoch prefills again
    replayed = [b for a in actions for b in a.replay]
    assert sorted(replayed) == list(range(10))  # every batch replayed exactly once, none lost
    assert total_updates(actions) == 8  # 2 x (1 prefill + 3 steady + 1 merged flush): 10 batches, 8 updates


def test_delayed_plan_drains_before_every_checkpoint():
    actions = plan(batches_per_epoch=50, epochs=1, save_steps=4, max_steps=None, delayed=True)
    saves = [a for a in actions if should_checkpoint(a, 4, total_updates(actions))]
    assert [a.update for a in saves][:3] == [4, 8, 12]
    for a in saves:
        assert a.flush  # nothing prepared is pending when a checkpoint is written
        following = actions[actions.index(a) + 1] if a is not actions[-1] else None
        assert following is None or following.update is None  # after a drain the slot refills first


def test_delayed_plan_stops_at_max_steps_with_the_slot_empty():
    actions = plan(batches_per_epoch=100, epochs=3, save_steps=1000, max_steps=7, delayed=True)
    assert total_updates(actions) == 7 and actions[-1].update == 7 and actions[-1].flush
    replayed = [b for a in actions for b in a.replay]
    prepared = [a.batch for a in actions]
    assert sorted(replayed) == prepared  # everything prepared was replayed


@pytest.mark.parametrize("per_epoch,epochs,save,max_steps", [(1, 3, 1, None), (2, 2, 1, None), (7, 3, 5, 11),
                                                             (3, 1, 2, None), (16, 5, 100, None)])
def test_every_prepared_batch_is_replayed_once(per_epoch, epochs, save, max_steps):
    actions = plan(per_epoch, epochs, save, max_steps, delayed=True)
    replayed = [b for a in actions for b in a.replay]
    assert sorted(replayed) == [a.batch for a in actions]
    assert [a.update for a in actions if a.update] == list(range(1, total_updates(actions) + 1))
