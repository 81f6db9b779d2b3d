"""The trainer's worker with a GPU node's time stood in by sleeps (no CPU), for bench/bench_actors.py.

On this CPU machine four processes share two cores, so the real compute of four ranks would measure the cores'
contention, not the schedule. This worker adds a known latency, without CPU, to each rollout chunk (per row rolled
out) and to each replayed update (per row replayed), read from VIDEOGRPO_BENCH_ROLLOUT_LATENCY and
VIDEOGRPO_BENCH_REPLAY_LATENCY (seconds per row), then runs the trainer's own worker: the rollouts, the scoring, the
replay and the actors' messages are the real ones, only slower, as they are on a GPU node where they are the
longest part of a step.
"""

from __future__ import annotations

import os
import sys
import time

ROLLOUT_VAR = "VIDEOGRPO_BENCH_ROLLOUT_LATENCY"
REPLAY_VAR = "VIDEOGRPO_BENCH_REPLAY_LATENCY"


def install() -> None:
    from videogrpo.grpo import objectives, rollout_batch

    per_rollout_row = float(os.environ.get(ROLLOUT_VAR, "0"))
    per_replay_row = float(os.environ.get(REPLAY_VAR, "0"))
    rollout_chunk, replay_update = rollout_batch.rollout_chunk, objectives.replay_update

    def slow_rollout_chunk(trainer, batch_index, rows, *args, **kwargs):
        time.sleep(per_rollout_row * len(rows))
        return rollout_chunk(trainer, batch_index, rows, *args, **kwargs)

    def slow_replay_update(trainer, prepared, rows, *args, **kwargs):
        time.sleep(per_replay_row * sum(len(chunk.prompts) for chunk in prepared.chunks))
        return replay_update(trainer, prepared, rows, *args, **kwargs)

    rollout_batch.rollout_chunk = slow_rollout_chunk
    objectives.replay_update = slow_replay_update


if __name__ == "__main__":
    install()
    from videogrpo.grpo import worker

    sys.exit(worker.main())
