"""Benchmark: what each algorithm preset (config/algorithms, docs/options.md#algorithm-presets) costs per update
against the reference's GRPO, side by side.

    .venv/bin/python bench/bench_presets.py [--updates 4] [--repeats 3] [--smoke]

Two measurements in one invocation:
- **At the 5B shape** (counted, not run): the transformer FLOPs of one update of the 5B recipe
  (config/recipes/rl_5b_cps.yaml, its real shape on the meta device) with each preset layered after it, from
  grpo/flops.py as the planner counts them (`planner.update_flops`: rollout, replay, the old policy's and the
  reference's forwards), per update (a rollout batch) and per optimizer update, and the ratio to the recipe's.
- **On this CPU** (run): the tiny default in a world of one rank in this process (bench/bench_options.py's runner),
  the reference's GRPO and each preset layered after it, `--updates` updates each, every configuration `--repeats`
  times interleaved: seconds per update (the metrics' `time_step_s`), its rollout and replay parts, per run the
  median after the first update, then the median over runs, with the spread of identical runs beside each ratio.
Nothing is asserted about speed. Record the output in bench/RESULTS.md. `--smoke` (what the tests run): 2 updates
per run, once.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("flow_grpo_fast", "grpo_guard", "mixgrpo", "mixgrpo_flash", "diffusion_nft")
BASE = {"mixgrpo_flash": ("mixgrpo",)}
"""The presets a preset is layered after (its header's command)."""
RECIPE = "config/recipes/rl_5b_cps.yaml"


def layers(preset: str | None) -> list[str]:
    """The preset's files in the order they layer (none for the reference)."""
    names = [*BASE.get(preset, ()), preset] if preset else []
    return [f"config/algorithms/{name}.yaml" for name in names]


def flops_at_5b() -> list[tuple[str, int, float, float]]:
    """(configuration, optimizer updates an update, PFLOP an update, PFLOP an optimizer update) at the 5B shape."""
    from videogrpo import config
    from videogrpo.grpo import minibatches
    from videogrpo.preflight import planner

    rows = []
    for preset in (None, *PRESETS):
        cfg = config.load([REPO / "config/config.yaml", REPO / RECIPE, *(REPO / p for p in layers(preset))])
        step = planner.update_flops(cfg, planner.released_shape(cfg))
        per_step = minibatches.updates_per_step(cfg.grpo)
        total = (step.train + step.inference) / 1e15
        rows.append((preset or "reference GRPO (the recipe)", per_step, total, total / per_step))
    return rows


def tiny_config(updates: int, preset: str | None) -> dict:
    """bench_options' tiny default in a world of one, with the preset's layers merged after it."""
    from bench.bench_options import config
    from videogrpo.config import deep_merge

    cfg = config(updates, {})
    for path in layers(preset):
        cfg = deep_merge(cfg, yaml.safe_load((REPO / path).read_text()))
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=4, help="updates (rollout batches) per run")
    parser.add_argument("--repeats", type=int, default=3, help="identical runs of every configuration")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: 2 updates, once")
    args = parser.parse_args()
    if args.smoke:
        args.updates, args.repeats = 2, 1
    from bench.bench_options import per_run, spread, train
    from bench.bench_trainer import build_inputs

    print(f"At the 5B shape ({RECIPE}: 32 prompts x 32 members, 81x512x512, its steps), grpo/flops.py's count:\n")
    rows = flops_at_5b()
    reference = rows[0][2]
    print("| configuration | optimizer updates an update | PFLOP an update | / reference | PFLOP an optimizer update |")
    print("|---|---|---|---|---|")
    for name, per_step, total, per_update in rows:
        print(f"| {name} | {per_step} | {total:,.0f} | {total / reference:.3f} | {per_update:,.0f} |")

    root = Path(tempfile.mkdtemp(prefix="videogrpo-bench-presets-"))
    names = ("reference", *PRESETS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    try:
        model, dataset, _ = build_inputs(root)
        for rep in range(args.repeats):
            for index, name in enumerate(names):
                cfg = tiny_config(args.updates, None if name == "reference" else name)
                runs[name].append(train(cfg, root / f"{index}-{rep}", model, dataset))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\nOn this CPU: the tiny model, 1 rank in this process x 4 rollouts an update, {args.updates} updates per "
        f"run, {args.repeats} identical runs per configuration, interleaved; per run the median over updates after the "
        "first, then the median over runs\n"
    )
    median = statistics.median
    t_ref = per_run(runs["reference"], "time_step_s")
    print(
        "| configuration | sampling steps | s/update | spread | / reference | rollout s | replay s | optimizer updates "
        "| modelled FLOPs / reference |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    first_ref = runs["reference"][0]["updates"][0]
    flops_ref = first_ref["model_flops_per_update"] + first_ref["inference_flops_per_update"]
    for name in names:
        t = per_run(runs[name], "time_step_s")
        rollout, replay = per_run(runs[name], "time_rollout_s"), per_run(runs[name], "time_replay_s")
        first = runs[name][0]["updates"][0]
        flops = first["model_flops_per_update"] + first["inference_flops_per_update"]
        steps = tiny_config(args.updates, None if name == "reference" else name)["grpo"]["sampling_steps"]
        print(
            f"| {name} | {steps} | {median(t):.3f} | {spread(t):.1%} | {median(t) / median(t_ref):.3f} "
            f"| {median(rollout):.3f} | {median(replay):.3f} | {first.get('optimizer_updates', 1)} "
            f"| {flops / flops_ref:.2f} |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
