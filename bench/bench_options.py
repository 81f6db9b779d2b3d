"""Benchmark: what each option beyond the reference (docs/options.md) costs per update, side by side.

    .venv/bin/python bench/bench_options.py [--updates 6] [--repeats 3] [--smoke]

Everything runs in one invocation, in this process (a world of one rank, no torchrun: the tiny default of
config/config.yaml with one process and one prompt per update, as tests/harness.py's `solo_config` builds it), on the
tiny model and synthetic dataset of bench/bench_trainer.py's `build_inputs`. Each configuration turns one option on
against the same run with every option off:
- `train.lora_rank: 4` (LoRA): seconds per update, trainable parameters and the export (adapters file against the
  full transformer file of the run without it);
- `train.validate_every: 1` (validation during training): the seconds of one validation point (`val/time_s`)
  against an update's;
- `train.validate_rewards: [vbvr_vlm]` beside it (a gold reward: the judge, here the loopback stand-in of
  demo.stand_in_judge started as a process): a validation point's seconds against validation's without it;
- `parallel.offload_optimizer` and `offload_gradients` (optimizer and gradient offload): the optimizer step
  (`Experts.step`, timed around each call: gradient reduction, clipping, parking the gradients, AdamW);
- `grpo.skip_zero_variance_groups` and `grpo.clip_range_high: 0.02` together (expected: no change);
- the algorithms (GRPO-Guard on DanceGRPO, an SDE window of 2 steps, DiffusionNFT on the Euler sampler): their
  replayed steps and modelled FLOPs per update against off's, and the rollout and replay seconds.
Seconds per update are the metrics' `time_step_s` (rollout, reward wait, replay), per run the median over the
updates after the first (warm-up), then the median over runs. Every configuration runs `--repeats` times,
interleaved, so the spread between identical runs is printed next to every ratio: a ratio within the off run's
spread is noise. Nothing is asserted about speed. Record the output in bench/RESULTS.md.
`--smoke` (what the tests run): 2 updates per run, once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# Each configuration: its name in the table and the fields it turns on (sections of the config).
OPTIONS = {
    "off (the reference)": {},
    "LoRA": {"train": {"lora_rank": 4}},
    "validation during training": {"train": {"validate_every": 1}},
    "gold reward (the judge)": {"train": {"validate_every": 1, "validate_rewards": ["vbvr_vlm"]}},
    "optimizer and gradient offload": {"parallel": {"offload_optimizer": True, "offload_gradients": True}},
    "skip_zero_variance_groups + clip_range_high": {
        "grpo": {"skip_zero_variance_groups": True, "clip_range_high": 0.02}
    },
    "GRPO-Guard": {"grpo": {"grpo_guard": True, "sampler": "dancegrpo", "eta": 0.3}},
    "SDE window": {"grpo": {"sde_window_size": 2, "sde_window_range": [0, 4]}},
    "DiffusionNFT": {
        "grpo": {"algorithm": "nft", "sampler": "euler", "share_group_noise": False, "delayed_replay": False}
    },
}
ALGORITHMS = ("GRPO-Guard", "SDE window", "DiffusionNFT")
"""The configurations that change what an update trains: their own cost is their replayed steps and FLOPs."""
FIELDS = {
    "off (the reference)": "every option off",
    "LoRA": "train.lora_rank: 4",
    "validation during training": "train.validate_every: 1",
    "gold reward (the judge)": "train.validate_every: 1, validate_rewards: [vbvr_vlm]",
    "optimizer and gradient offload": "parallel.offload_optimizer, offload_gradients: true",
    "skip_zero_variance_groups + clip_range_high": "grpo.skip_zero_variance_groups: true, clip_range_high: 0.02",
    "GRPO-Guard": "grpo.grpo_guard: true, sampler: dancegrpo, eta: 0.3",
    "SDE window": "grpo.sde_window_size: 2, sde_window_range: [0, 4]",
    "DiffusionNFT": "grpo.algorithm: nft, sampler: euler, share_group_noise: false, delayed_replay: false",
}


@contextlib.contextmanager
def judge_stand_in():
    """The judge's loopback stand-in (demo.stand_in_judge) in its own process: its endpoint while it serves."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "videogrpo.demo.stand_in_judge", "--port", str(port)])
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{endpoint}/v1/models", timeout=1).close()
                break
            time.sleep(0.05)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


def config(updates: int, options: dict, judge: str = "") -> dict:
    """The tiny default in a world of one (tests/harness.py's solo_config), `updates` updates, `options` on;
    `judge`: the endpoint a gold judge reward scores at."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["evalkit"]["path"] = str(REPO / cfg["evalkit"]["path"])
    for field in ("judge_prompts", "judge_protocol"):
        cfg["reward"][field] = str(REPO / cfg["reward"][field])
    cfg["reward"]["judge_endpoint"] = judge
    cfg["logging"] = {"wandb_mode": "disabled"}
    cfg["parallel"]["procs_per_node"] = 1
    cfg["grpo"]["prompts_per_step"] = 1  # shared-prompt waves must divide the world
    cfg["train"].update(max_steps=updates, save_steps=10_000)  # the one checkpoint after the last update, untimed
    for section, values in options.items():
        cfg[section].update(values)
    return cfg


def train(cfg: dict, out: Path, model: Path, dataset: Path) -> dict:
    """One run in this process (as tests/harness.py's trainer_in_process): its metrics, every `Experts.step`'s
    seconds, its trainable parameters and the bytes of its exported transformer file."""
    import torch

    from videogrpo import config as config_module
    from videogrpo.grpo.trainer import Trainer, TrainPaths
    from videogrpo.models.lora import ADAPTERS_FILE
    from videogrpo.parallel import process_groups

    resolved = config_module.from_dict(cfg)
    torch.set_num_threads(resolved.parallel.cpu_threads)  # what process_groups.init does in a worker
    paths = TrainPaths.under(out, model, dataset, Path(cfg["evalkit"]["path"]))
    out.mkdir(parents=True)
    with open(out / "log.txt", "w") as log, contextlib.redirect_stderr(log):
        trainer = Trainer(resolved, paths, process_groups.Context(0, 1, 0, torch.device("cpu")), "bench")
        steps, step = [], trainer.experts.step

        def timed_step(lr: float, max_norm: float) -> float:
            t0 = time.monotonic()
            norm = step(lr, max_norm)
            steps.append(time.monotonic() - t0)
            return norm

        trainer.experts.step = timed_step
        trainer.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    exported = out / "final/transformer"
    files = [exported / ADAPTERS_FILE, exported / "diffusion_pytorch_model.safetensors"]
    return {
        "updates": [r for r in rows if "time_step_s" in r],
        "validation": [r for r in rows if "val/time_s" in r],
        "optimizer_step": steps,
        "trainable": sum(p.numel() for p in trainer.experts.params),
        "export": next((f.name, f.stat().st_size) for f in files if f.is_file()),
    }


def steady(values: list[float], skip: int = 1) -> float:
    """The median after the first `skip` (warm-up); the last one when there are no more."""
    return statistics.median(values[skip:] or values[-1:])


def spread(values: list[float]) -> float:
    """(max - min) / median of repeated identical measurements."""
    return (max(values) - min(values)) / statistics.median(values)


def per_run(runs: list[dict], key: str) -> list[float]:
    """Each run's steady value of a metric of its updates."""
    return [steady([m[key] for m in run["updates"]]) for run in runs]


def _trained_cost(run: dict, off: dict) -> str:
    """Replayed steps and modelled FLOPs per update (the metrics' count, grpo/flops.py) against off's."""
    first, base = run["updates"][0], off["updates"][0]
    flops = first["model_flops_per_update"] + first["inference_flops_per_update"]
    flops_off = base["model_flops_per_update"] + base["inference_flops_per_update"]
    return (
        f"{first['trained_timesteps']} steps replayed against off's {base['trained_timesteps']}; modelled FLOPs per "
        f"update x{flops / flops_off:.2f} off's"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=6, help="optimizer updates per run")
    parser.add_argument("--repeats", type=int, default=3, help="identical runs of every configuration")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 2 updates, once")
    args = parser.parse_args()
    if args.smoke:
        args.updates, args.repeats = 2, 1
    from bench.bench_trainer import build_inputs

    root = Path(tempfile.mkdtemp(prefix="videogrpo-bench-options-"))
    runs: dict[str, list[dict]] = {name: [] for name in OPTIONS}
    try:
        # The latency-patched EvalKit copy is bench_trainer's; these runs score with the tiny default's.
        model, dataset, _ = build_inputs(root)
        with judge_stand_in() as judge:
            for rep in range(args.repeats):
                for index, (name, options) in enumerate(OPTIONS.items()):
                    cfg = config(args.updates, options, judge)
                    runs[name].append(train(cfg, root / f"{index}-{rep}", model, dataset))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cfg = config(args.updates, {})
    g = cfg["grpo"]
    print(
        f"tiny model, {cfg['video']['num_frames']} frames {cfg['video']['height']}x{cfg['video']['width']}, "
        f"{g['sampling_steps']} sampling steps, 1 rank in this process x {g['group_size'] * g['prompts_per_step']} "
        f"rollouts, {cfg['evalkit']['workers']} scorer workers, {cfg['parallel']['cpu_threads']} torch thread, "
        f"{args.updates} updates per run, {args.repeats} identical runs per configuration, interleaved; per run the "
        f"median over updates after the first, then the median over runs"
    )
    off = runs["off (the reference)"]
    t_off, replay_off = per_run(off, "time_step_s"), per_run(off, "time_replay_s")
    rollout_off = per_run(off, "time_rollout_s")
    step_off = [steady(run["optimizer_step"]) for run in off]
    trainable_off, (file_off, bytes_off) = off[0]["trainable"], off[0]["export"]
    print(
        f"\nspread of identical runs with every option off: {spread(t_off):.1%} per update, {spread(rollout_off):.1%} "
        f"rollout, {spread(replay_off):.1%} replay, {spread(step_off):.1%} optimizer step; a ratio to off within these "
        f"is noise"
    )
    print(
        "\n| option | fields on | s/update | min-max of runs | spread | / off | rollout s | / off | replay s | / off "
        "| optimizer step s | / off | the option's own cost |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, option_runs in runs.items():
        t, replay = per_run(option_runs, "time_step_s"), per_run(option_runs, "time_replay_s")
        rollout = per_run(option_runs, "time_rollout_s")
        step = [steady(run["optimizer_step"]) for run in option_runs]
        file, size = option_runs[0]["export"]
        if name == "LoRA":
            trainable = option_runs[0]["trainable"]
            own = (
                f"trainable {trainable:,} of off's {trainable_off:,} ({trainable / trainable_off:.1%}); export "
                f"{file} {size:,} B against {file_off} {bytes_off:,} B ({size / bytes_off:.3f})"
            )
        elif name == "validation during training":
            points = [steady([v["val/time_s"] for v in run["validation"]]) for run in option_runs]
            prompts = option_runs[0]["validation"][0]["val/prompts"]
            own = (
                f"one validation point ({prompts} held-out prompts): {statistics.median(points):.3f} s "
                f"(runs {min(points):.3f}-{max(points):.3f}), {statistics.median(points) / statistics.median(t):.2f} "
                f"of an update; every point adds it"
            )
        elif name == "gold reward (the judge)":
            points = [steady([v["val/time_s"] for v in run["validation"]]) for run in option_runs]
            plain = [steady([v["val/time_s"] for v in run["validation"]]) for run in runs["validation during training"]]
            own = (
                f"one validation point with the gold reward: {statistics.median(points):.3f} s (runs "
                f"{min(points):.3f}-{max(points):.3f}) against {statistics.median(plain):.3f} s without it "
                f"(x{statistics.median(points) / statistics.median(plain):.2f})"
            )
        elif name == "optimizer and gradient offload":
            own = f"optimizer step x{statistics.median(step) / statistics.median(step_off):.2f} off's"
        elif name in ALGORITHMS:
            own = _trained_cost(option_runs[0], off[0])
        elif name == "off (the reference)":
            own = f"trainable {trainable_off:,}; export {file_off} {bytes_off:,} B"
        else:
            own = "none expected (the skipped groups' rollouts are replayed still)"
        print(
            f"| {name} | {FIELDS[name]} | {statistics.median(t):.3f} | {min(t):.3f}-{max(t):.3f} | {spread(t):.1%} "
            f"| {statistics.median(t) / statistics.median(t_off):.3f} | {statistics.median(rollout):.3f} "
            f"| {statistics.median(rollout) / statistics.median(rollout_off):.3f} | {statistics.median(replay):.3f} "
            f"| {statistics.median(replay) / statistics.median(replay_off):.3f} | {statistics.median(step):.4f} "
            f"| {statistics.median(step) / statistics.median(step_off):.3f} | {own} |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
