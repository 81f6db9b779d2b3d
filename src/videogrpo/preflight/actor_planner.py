"""Rollout actor layouts for `videogrpo plan --actors` (docs/options.md#rollout-actors): the same GPUs split into
train ranks and rollout actors, each split with its memory and a modelled time per update.

For each split (a quarter, a half and three quarters of the nodes training; of the GPUs on one node), the train ranks
are planned as a job of their own (the planner's search at their GPU count: the best layout that fits), and an
actor by its own memory plan (preflight.actor_memory). The time model is the planner's, cut in two:
- the train ranks' part: their layout's modelled update without its rollout compute and its videos (the actors do
  both);
- an actor's part: its share of the rollout FLOPs (the most rows any actor rolls out: a batch's pieces are dealt in
  turn, so past the pieces' count actors idle) on one GPU at the assumed MFU, its videos at the assumed cost each,
  and the trained tensors sent to it once an update over the network.
Synchronous: the two parts one after the other; asynchronous (the automatic prefetch): the longer of the two, at a
staleness of prefetch - 1 updates. What the model leaves out is said where it is printed.

May import: `config`, `grpo`, `preflight.planner`, `preflight.actor_memory`, `preflight.memory_plan` and the core
modules.
"""

from __future__ import annotations

from videogrpo.config import Config, checks
from videogrpo.grpo import actor_schedule, actors
from videogrpo.preflight import actor_memory, memory_plan, planner


def splits(gpus: int, nodes: int) -> list[tuple[str, int]]:
    """The splits tried: ("train_nodes", k) across nodes, ("train_ranks", r) on one node."""
    field, whole = ("train_nodes", nodes) if nodes > 1 else ("train_ranks", gpus)
    return [(field, k) for k in sorted({max(1, whole // 4), whole // 2, 3 * whole // 4}) if 0 < k < whole]


def split_line(cfg: Config, field: str, count: int, gpus: int, nodes: int, gpu_gib, host_gib, assume, shape) -> str:
    """One split's line: its train layout, its times and an actor's peak; or why it does not run."""
    per_node = gpus // nodes
    train_gpus = count * per_node if field == "train_nodes" else count
    train_nodes = count if field == "train_nodes" else 1
    label = f"{field.replace('_', ' ')} {count}: {train_gpus} GPU(s) train, {gpus - train_gpus} roll out"
    fitting, failing, _ = planner.search(cfg, train_gpus, train_nodes, gpu_gib, host_gib, assume, shape)
    if not fitting:
        why = failing[0].breaks if failing else "the config's checks refuse every layout at that world"
        return f"  {label}: the train ranks fit no layout ({why})"
    best = fitting[0]
    # The whole job with this split, laid out as the train ranks' best layout.
    layer = best.layout.layer(gpu_gib)
    layer["parallel"].update(nodes=nodes, procs_per_node=per_node)
    split = planner.with_changes(cfg, {**layer, "actors": {field: count, "asynchronous": True}})
    if found := checks.problems(split):
        return f"  {label}: refused: {found[0]}"
    plan = actor_memory.actor_plan(split, shape)
    limit = plan.available * (1 - assume.headroom)
    if plan.peak > limit:
        return f"  {label}: an actor does not fit (peak {memory_plan.gib(plan.peak)} > {memory_plan.gib(limit)})"
    peak = assume.peak_flops * assume.mfu
    flops = planner.update_flops(best.cfg, shape)
    train_s = best.total_s - flops.inference / (train_gpus * peak) - best.seconds["videos"]
    dealt = actors.pieces(split, split.train_world_size)
    busiest = max(
        sum(len(rows) for k, (_, _, rows) in enumerate(dealt) if actors.actor_of(k, train_gpus, gpus) == a)
        for a in range(train_gpus, gpus)
    )
    rows = split.grpo.group_size * split.grpo.prompts_per_step
    sent = shape.trainable * memory_plan.BYTES[split.parallel.param_dtype]
    actor_s = flops.inference * busiest / rows / peak + busiest * assume.video_overhead_s
    actor_s += sent / (assume.network_gbps * 1e9)
    prefetch = actor_schedule.prefetch(split)
    return (
        f"  {label} ({best.layout.describe()}): {train_s + actor_s:.0f} s/update synchronous, "
        f"{max(train_s, actor_s):.0f} s asynchronous at staleness {prefetch - 1} (prefetch {prefetch}); train part "
        f"{train_s:.0f} s, actors' {actor_s:.0f} s; an actor's peak {memory_plan.gib(plan.peak)}"
    )


def actor_lines(cfg: Config, gpus: int, nodes: int, gpu_gib, host_gib, assume, shape, colocated_s) -> list[str]:
    """What `videogrpo plan --actors` adds: each split's line, beside the best colocated layout's time."""
    best = f"{colocated_s:.0f} s/update" if colocated_s is not None else "no colocated layout fits"
    lines = [
        f"with rollout actors (the `actors` section; the best colocated layout above: {best}); modelled without the "
        "link's host copies, the inference FLOPs (the rollout's, and the KL reference's when on) on the actors:"
    ]
    tried = splits(gpus, nodes)
    lines += [split_line(cfg, f, k, gpus, nodes, gpu_gib, host_gib, assume, shape) for f, k in tried] or [
        "  none: one GPU cannot be split"
    ]
    return lines
