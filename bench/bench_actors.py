"""Benchmark: updates per hour of the colocated trainer and of rollout actors (synchronous, and asynchronous at
prefetch 1 and 2), at the same total ranks.

    .venv/bin/python bench/bench_actors.py [--updates 10] [--repeats 2] [--smoke]

Every mode runs side by side in one invocation on the tiny model, 4 gloo processes: all 4 training and rolling out
(colocated), or 2 training beside 2 actors. A GPU node's time is stood in by sleeps, without CPU
(bench/slow_worker.py): a rollout latency per row rolled out and a replay latency per row replayed; the reward has a
latency per video (a remote judge). Four processes on this machine's two cores would otherwise measure the cores'
contention rather than the schedule. The table gives each mode's seconds per update (the train root's step, the
median over the updates after the first 2, then over identical runs), updates per hour, its ratio to the colocated
run and to the synchronous actors, the spread of identical runs and the staleness it ran at; then the ideal
overlap: what overlapping the actors' part of a synchronous step (a batch's rollout and scoring, which the train
ranks wait for) with the train ranks' part (the rest) would give, max(actors, train) against their sum. Record the
output in bench/RESULTS.md. `--smoke` (what the tests run): 2 processes, 3 updates, no latencies, once.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {
    "colocated": {},
    "actors, synchronous": {"asynchronous": False},
    "actors, asynchronous, prefetch 1": {"asynchronous": True, "prefetch": 1},
    "actors, asynchronous, prefetch 2": {"asynchronous": True, "prefetch": 2},
}


def mode_config(base: dict, actors: dict | None, ranks: int) -> dict:
    import json

    cfg = json.loads(json.dumps(base))
    cfg["parallel"].update(procs_per_node=ranks)
    if actors is not None:
        cfg["actors"] = {"train_ranks": ranks // 2, **actors}
    return cfg


def main() -> None:
    from bench.bench_trainer import build_inputs, config, spread, steady, train
    from bench.slow_worker import REPLAY_VAR, ROLLOUT_VAR

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=10, help="optimizer updates per run")
    parser.add_argument("--repeats", type=int, default=2, help="identical runs of every mode")
    parser.add_argument("--rollout-latency", type=float, default=0.08, help="seconds per row rolled out")
    parser.add_argument("--replay-latency", type=float, default=0.08, help="seconds per row replayed")
    parser.add_argument("--reward-latency", type=float, default=0.4, help="seconds per video scored")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 2 processes, 3 updates, no latency")
    args = parser.parse_args()
    ranks = 4
    if args.smoke:
        args.updates, args.repeats, ranks = 3, 1, 2
        args.rollout_latency = args.replay_latency = args.reward_latency = 0.0
    env = {ROLLOUT_VAR: str(args.rollout_latency), REPLAY_VAR: str(args.replay_latency)}
    root = Path(tempfile.mkdtemp(prefix="videogrpo-bench-actors-"))
    runs: dict[str, list] = {}
    try:
        model, dataset, kit = build_inputs(root)
        base = config(kit, args.updates, False)
        base["grpo"].update(group_size=8, prompts_per_step=2)
        base["evalkit"].update(workers=4)
        for rep in range(args.repeats):
            for name, actors in MODES.items():
                cfg = mode_config(base, None if name == "colocated" else actors, ranks)
                tag = f"{name.replace(', ', '-').replace(' ', '')}-{rep}"
                rows = train(root, tag, cfg, model, dataset, args.reward_latency, "bench.slow_worker", env)
                runs.setdefault(name, []).append(rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"tiny model, 17 frames 64x64, 8 sampling steps, {ranks} processes, 8 x 2 rollouts a batch, 4 scorer workers "
        f"a scoring rank; latencies (no CPU): rollout {args.rollout_latency:g} s a row, replay "
        f"{args.replay_latency:g} s a row, reward {args.reward_latency:g} s a video; {args.updates} updates a run, "
        f"{args.repeats} identical run(s) a mode; per run the median over updates after the first 2"
    )
    print(
        "\n| mode | s / update | updates / hour | vs colocated | vs synchronous actors | spread of identical runs "
        "| staleness |"
    )
    print("|---|---|---|---|---|---|---|")
    step = {name: [steady([m["time_step_s"] for m in run]) for run in done] for name, done in runs.items()}
    colocated, synchronous = statistics.median(step["colocated"]), statistics.median(step["actors, synchronous"])
    sync = runs["actors, synchronous"]
    actor_part = statistics.median(steady([m["time_rollout_s"] for m in run]) for run in sync)
    train_part = statistics.median(steady([m["time_step_s"] - m["time_rollout_s"] for m in run]) for run in sync)
    for name, done in runs.items():
        seconds = statistics.median(step[name])
        staleness = max(m.get("rollout_staleness", 0) for run in done for m in run)
        print(
            f"| {name} | {seconds:.3f} | {3600 / seconds:.0f} | {colocated / seconds:.3f} | "
            f"{seconds / synchronous:.3f} | {spread(step[name]):.1%} | {staleness} |"
        )
    print(
        f"\nsynchronous actors, a step: the actors' part (their rollout and scoring, which the train ranks wait for) "
        f"{actor_part:.3f} s, the train ranks' part {train_part:.3f} s; overlapping the two alone would take "
        f"max / sum = {max(actor_part, train_part) / (actor_part + train_part):.3f} of the synchronous step (the "
        "asynchronous actors also score a batch's last piece while the next batch rolls out)"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
