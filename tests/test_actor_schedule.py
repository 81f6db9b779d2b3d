"""The rollout actors' schedule (grpo/actor_schedule.py): when each batch is dealt, under which weights, and what a
checkpoint keeps; and its agreement with the reference's own asynchronous loop, stored by tools/ref_diff.

tests/data/ref_diff/split_schedule.json holds, for every configuration of tools/ref_diff/split_schedule.py's grid,
what the reference's `_run_async_split_train_root_loop` did under three finish orders of its actors (the same in
all three): its prefetch, and per step the updates taken when the step was created and its policy version. Written
by `tools/ref_diff/run_all.sh` (its split-reference step) against the reference at 252c2ff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from videogrpo.grpo import actor_schedule, replay

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "tests/data/ref_diff/split_schedule.json"


def plain(batches: int) -> list:
    return replay.plan(batches, 1, 0, None, False)


def test_prefetch_one_and_interval_one_is_the_synchronous_mode():
    for d in actor_schedule.schedule(plain(5), 1, 1):
        assert d.at == d.action and d.version == d.action  # dealt after the update before it, under its weights


def test_a_batch_is_dealt_prefetch_minus_one_ahead_under_the_newest_collection():
    got = [(d.at, d.version) for d in actor_schedule.schedule(plain(7), 3, 2)]
    assert got == [(0, 0), (0, 0), (0, 0), (1, 0), (2, 2), (3, 2), (4, 4)]


@pytest.mark.parametrize("delayed", [False, True])
def test_staleness_stays_within_the_bound(delayed):
    for prefetch in (1, 2, 3, 5):
        for interval in (1, 2, 3):
            actions = replay.plan(4, 3, 2, None, delayed)
            dispatches = {d.batch: d for d in actor_schedule.schedule(actions, prefetch, interval)}
            bound = actor_schedule.staleness_bound(prefetch, interval, delayed)
            worst = 0
            for action in actions:
                if action.update is not None:
                    staleness = action.update - 1 - dispatches[action.replay].version
                    assert 0 <= staleness <= bound, (prefetch, interval, action)
                    worst = max(worst, staleness)
            if not delayed:  # the bound is reached: not a loose one
                assert worst == bound, (prefetch, interval)


def test_a_checkpoint_keeps_the_older_weights_batches_in_flight_need():
    actions = plain(7)
    dispatches = actor_schedule.schedule(actions, 3, 2)
    done = actor_schedule.updates_before(actions)
    # Versions by batch: 0 0 0 0 2 2 4. After update 2 (loop index 2 next), batches 2 and 3 need version 0; after
    # update 5, batch 5 needs 2 and batch 6 (dealt after update 4) needs 4.
    assert actor_schedule.versions_kept(dispatches, done, 2) == {0}
    assert actor_schedule.versions_kept(dispatches, done, 4) == {2}
    assert actor_schedule.versions_kept(dispatches, done, 5) == {2, 4}
    assert actor_schedule.versions_kept(actor_schedule.schedule(actions, 1, 1), done, 3) == set()


def test_automatic_prefetch_is_the_reference_formula():
    assert actor_schedule.auto_prefetch(2, 4, None) == 3  # one job a step: actors + 1
    assert actor_schedule.auto_prefetch(8, 8, 2) == 3  # 4 jobs a step: ceil(8 / 4) + 1
    assert actor_schedule.auto_prefetch(1, 8, 1) == 2


def test_the_schedule_agrees_with_the_reference_loop_step_for_step():
    sys.path.insert(0, str(REPO / "tools/ref_diff"))
    import project_adapter
    import split_schedule

    stored = json.loads(STORED.read_text())
    assert stored["reference_commit"].startswith("252c2ff") and stored["orders"] == ["fifo", "lifo", "random"]
    ours = project_adapter.split_schedules(split_schedule.GRID)
    assert len(stored["runs"]) == len(ours) == len(split_schedule.GRID) == 576
    for mine, run in zip(ours, stored["runs"]):
        prefetch, steps = split_schedule.stored_steps(run)
        assert mine["prefetch"] == prefetch, mine["point"]
        assert mine["steps"] == steps, mine["point"]
    # It can fail: one batch more of prefetch than the reference's formula deals every batch an update earlier.
    index, point = next((i, pt) for i, pt in enumerate(split_schedule.GRID) if pt["actors"] == 2 and not pt["prefetch"])
    (ahead,) = project_adapter.split_schedules([dict(point, prefetch=ours[index]["prefetch"] + 1)])
    assert ahead["steps"] != split_schedule.stored_steps(stored["runs"][index])[1]
