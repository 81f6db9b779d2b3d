"""Benchmark: one-step-delayed replay against the synchronous loop, and the trainer's overhead.

    .venv/bin/python bench/bench_trainer.py [--updates 12] [--repeats 2] [--smoke]

Everything runs side by side in one invocation on the tiny model and synthetic data, 2 gloo processes:
1. calibration: a synchronous run with an instant reward measures rollout (R) and replay (T) per update;
2. the reward gets a known latency (sleep, no CPU) sized so that scoring one batch takes W ~ R + T,
   where overlapping helps most; the same run goes synchronous and delayed;
3. the same work as a synchronous update in a plain loop (`bench/raw_compute.py`: rollouts, decoding,
   scoring through the same pool, reward gathering, replay, clipping, AdamW) runs under torchrun too,
   timed in the same windows as the trainer's metrics.
Every configuration runs `--repeats` times, interleaved, so the spread between identical runs is
printed next to every ratio: a ratio within that spread is noise. Record the output in bench/RESULTS.md.
`--smoke` (what the tests run): 3 updates of 4 rollouts on one rank, once, the CPU-bound reward only (no
calibration, no latency-bound runs): the synchronous and the delayed run and the plain loop, three torchrun launches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LATENCY_VAR = "VIDEOGRPO_BENCH_REWARD_LATENCY"


def build_inputs(root: Path) -> tuple[Path, Path, Path]:
    from videogrpo.data.materialize import materialize
    from videogrpo.demo import synthetic_dataset
    from videogrpo.demo.tiny_ti2v import save_tiny_pipeline

    model = root / "model"
    save_tiny_pipeline(model, seed=0)
    tasks = list(synthetic_dataset.TASKS)
    synthetic_dataset.generate(root / "archives", tasks, 6, seed=0, frames=17, height=64, width=64, fps=16)
    dataset = root / "dataset"
    materialize(
        sorted((root / "archives/VBVR-Pro-RL-Video").glob("*.tar.gz")),
        dataset,
        tasks,
        6,
        2,
        42,
        "bench",
        {"repo": "synthetic"},
        log=lambda _: None,
    )
    # The reference EvalKit with a known, CPU-free latency in front of every score.
    kit = root / "evalkit"
    shutil.copytree(REPO / "src/videogrpo/demo/stand_in_evalkit", kit)
    entry = kit / "run_evaluation.py"
    entry.write_text(
        entry.read_text().replace(
            "    try:\n        evaluator = TASK_EVALUATOR_MAP[task_name]",
            f'    import os, time\n    time.sleep(float(os.environ.get("{LATENCY_VAR}", "0")))\n'
            "    try:\n        evaluator = TASK_EVALUATOR_MAP[task_name]",
        )
    )
    return model, dataset, kit


def config(kit: Path, updates: int, delayed: bool, smoke: bool = False) -> dict:
    from videogrpo.provenance.digest import evalkit_source_digest

    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["evalkit"].update(path=str(kit), digest=evalkit_source_digest(kit))  # the checkout with the latency added
    cfg["logging"] = {"wandb_mode": "disabled"}
    cfg["grpo"].update(delayed_replay=delayed, group_size=8, prompts_per_step=2)
    # Small scorer videos and 4 sleeping workers: the reward is mostly latency, not CPU that the
    # rollouts on this 2-core machine would compete for.
    cfg["evalkit"].update(video_size=64, workers=4)
    # save_steps past the end: the delayed run drains only at epoch ends, like a long real run.
    cfg["train"].update(max_steps=updates, epochs=50, save_steps=10_000)
    if smoke:  # one rank of 4 rollouts and one scorer worker: the code paths, not the sizes (one torch start per run)
        cfg["grpo"].update(group_size=4, prompts_per_step=1)  # shared prompts: a wave's prompts are the world's
        cfg["evalkit"].update(workers=1)
        cfg["parallel"].update(procs_per_node=1)
    return cfg


def torchrun(module: str, args: list[str], latency: float, log: Path, ranks: int, env: dict | None = None) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", **{LATENCY_VAR: str(latency)}, **(env or {}))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", module]
    argv += args
    with open(log, "w") as out:
        code = subprocess.run(argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    if code:
        raise SystemExit(f"{module} failed; see {log}:\n{log.read_text()[-3000:]}")


def train(
    root: Path,
    name: str,
    cfg: dict,
    model: Path,
    dataset: Path,
    latency: float,
    module: str = "videogrpo.grpo.worker",
    env: dict | None = None,
) -> list[dict]:
    """A torchrun of the trainer's worker (or `module`, a worker of its own) with the reward's `latency` and `env`."""
    out = root / name
    torchrun(
        module,
        [
            "--config-json",
            json.dumps(cfg),
            "--run-id",
            name,
            "--model",
            str(model),
            "--dataset",
            str(dataset),
            "--evalkit",
            cfg["evalkit"]["path"],
            "--checkpoints",
            str(out / "ckpt"),
            "--final",
            str(out / "final"),
            "--metrics",
            str(out / "metrics.jsonl"),
            "--run-dir",
            str(out),
        ],
        latency,
        root / f"{name}.log",
        cfg["parallel"]["procs_per_node"],
        env,
    )
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def steady(values: list[float], skip: int = 2) -> float:
    """The median after the first `skip` updates (compilation, warm-up); the last one when there are no more."""
    return statistics.median(values[skip:] or values[-1:])


def spread(values: list[float]) -> float:
    """(max - min) / median of repeated identical measurements."""
    return (max(values) - min(values)) / statistics.median(values)


def raw(root: Path, name: str, cfg: dict, model: Path, dataset: Path, kit: Path, updates: int) -> list[dict]:
    log = root / f"{name}.log"
    torchrun(
        "bench.raw_compute",
        [
            "--config-json",
            json.dumps(cfg),
            "--model",
            str(model),
            "--dataset",
            str(dataset),
            "--evalkit",
            str(kit),
            "--updates",
            str(updates),
        ],
        0.0,
        log,
        cfg["parallel"]["procs_per_node"],
    )
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


WINDOWS = ("time_rollout_s", "time_reward_wait_s", "time_replay_s", "time_step_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=12, help="optimizer updates per run")
    parser.add_argument("--repeats", type=int, default=2, help="identical runs of every configuration")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 3 small updates, CPU-bound only")
    args = parser.parse_args()
    if args.smoke:
        args.updates, args.repeats = 3, 1
    rewards = (("cpu-bound", 0.0),) if args.smoke else (("latency-bound", None), ("cpu-bound", 0.0))
    root = Path(tempfile.mkdtemp(prefix="videogrpo-bench-"))
    try:
        model, dataset, kit = build_inputs(root)
        sync_cfg = config(kit, args.updates, False, args.smoke)
        delayed_cfg = config(kit, args.updates, True, args.smoke)
        ranks = sync_cfg["parallel"]["procs_per_node"]
        per_rank = sync_cfg["grpo"]["group_size"] * sync_cfg["grpo"]["prompts_per_step"] // ranks
        workers = sync_cfg["evalkit"]["workers"]
        if not args.smoke:
            calib = train(root, "calibration", sync_cfg, model, dataset, 0.0)
            # A latency-bound reward (a remote judge, or scoring on cores the trainer does not use): the
            # sleep alone takes about R + T per batch, where overlapping helps most.
            busy = steady([m["time_rollout_s"] + m["time_replay_s"] for m in calib])
            rewards = (("latency-bound", round(busy / math.ceil(per_rank / workers), 3)), ("cpu-bound", 0.0))
        runs: dict[str, list] = {}
        for rep in range(args.repeats):
            for name, lat in rewards:
                runs.setdefault(f"sync-{name}", []).append(
                    train(root, f"sync-{name}-{rep}", sync_cfg, model, dataset, lat)
                )
                runs.setdefault(f"delayed-{name}", []).append(
                    train(root, f"delayed-{name}-{rep}", delayed_cfg, model, dataset, lat)
                )
            runs.setdefault("raw", []).append(raw(root, f"raw-{rep}", sync_cfg, model, dataset, kit, args.updates))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"tiny model, 17 frames 64x64, 8 sampling steps, {ranks} ranks x {per_rank} rollouts, {workers} scorer "
        f"workers per rank, {args.updates} updates per run, {args.repeats} identical runs per configuration; "
        f"per run the median over updates after the first 2, then the median over runs"
    )
    print(
        "\n| reward | latency/video | R rollout | T replay | W reward wait | sync step | delayed step | delayed/sync "
        "| spread of identical runs (sync, delayed) | ideal |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, lat in rewards:
        sync, delayed = runs[f"sync-{name}"], runs[f"delayed-{name}"]
        window = {key: statistics.median(steady([m[key] for m in run]) for run in sync) for key in WINDOWS}
        t_sync = [steady([m["time_step_s"] for m in run]) for run in sync]
        t_delayed = [steady([m["time_step_s"] for m in run if m["delayed_replay_staleness"] > 0]) for run in delayed]
        rollout, replay, reward = window["time_rollout_s"], window["time_replay_s"], window["time_reward_wait_s"]
        ideal = max(rollout + replay, reward) / (rollout + reward + replay)
        print(
            f"| {name} | {lat:.3f} s | {rollout:.3f} | {replay:.3f} | {reward:.3f} | {statistics.median(t_sync):.3f} "
            f"| {statistics.median(t_delayed):.3f} | {statistics.median(t_delayed) / statistics.median(t_sync):.3f} "
            f"| {spread(t_sync):.1%}, {spread(t_delayed):.1%} | {ideal:.3f} |"
        )
    print(
        "\nTrainer overhead: synchronous updates with an instant reward, the trainer against the plain loop doing the "
        "same work (seconds per update, medians)"
    )
    print(
        "\n| window (what is timed) | trainer | plain loop | trainer / plain | spread of identical trainer runs "
        "| spread of identical plain runs |"
    )
    print("|---|---|---|---|---|---|")
    labels = {
        "time_rollout_s": "rollout: conditions, denoising, decode, submit to the scorer",
        "time_reward_wait_s": "reward wait: collect scores, gather over ranks, advantages",
        "time_replay_s": "replay: PPO loss over the trained timesteps, backward, all-reduce, clip, AdamW",
        "time_step_s": "whole update (the three above)",
    }
    for key, label in labels.items():
        trainer = [steady([m[key] for m in run]) for run in runs["sync-cpu-bound"]]
        plain = [steady([m[key] for m in run]) for run in runs["raw"]]
        print(
            f"| {label} | {statistics.median(trainer):.3f} | {statistics.median(plain):.3f} "
            f"| {statistics.median(trainer) / statistics.median(plain):.3f} | {spread(trainer):.1%} "
            f"| {spread(plain):.1%} |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
