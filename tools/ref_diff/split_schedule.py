"""The asynchronous rollout actors' schedule, this project's against the reference's own loop.

The reference side runs `_run_async_split_train_root_loop` of the reference's DanceGRPOSplitRuntimeMixin (its step
creation, prefetch, dispatch to the longest-free actor, result handling, weight collection every interval and its
training order) on an object that supplies what the loop calls of its trainer: a batch iterator, a policy-state
collector that records the version, stand-in actors that finish their jobs in a given order (first in first out,
last in first out, or seeded random), and training and optimizer steps that record the step. No model runs. It
records, per step, the updates taken when it was created and its policy version, and per job which actor got which
group members of which step, and whether the job carried the policy.

The project side (project_adapter.split_schedules) is `grpo/actor_schedule.py` on `replay.plan` for the same run:
per batch, the updates taken when it is dealt and its version.

Compared per grid point and finish order: the prefetch (the reference's automatic formula against the project's),
every step's creation point and policy version (must be equal), and that both cover every group member of every
step exactly once. Which actor rolls out which members differs by design (docs/fidelity.md: the reference deals up
to S members to the longest-free actor, this project a train rank's wave to actor k mod A) and is printed, not
judged: keyed draws make the rollouts the same whoever makes them.

  $V ref_diff.py split-reference W/sb.json; $P ref_diff.py split-videogrpo W/sa.json; $V ref_diff.py split-compare
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

GRID = [
    dict(actors=a, group=g, sample=s, prefetch=p, interval=i, batches=b, epochs=e, max_steps=m)
    for a in (1, 2, 3, 5)
    for g, s in ((4, 4), (4, 1), (8, 2), (8, 3))
    for p in (0, 1, 2, 3)
    for i in (1, 2, 3)
    for b, e, m in ((3, 2, None), (5, 1, None), (4, 2, 5))
]
"""Actors 1-5; group 4 or 8 with S = G, 1, 2, 3; prefetch automatic or 1-3; interval 1-3; 3 x 2, 5 x 1 batches,
and 4 x 2 stopped at 5 steps (576 points, each under 3 finish orders on the reference side)."""
ORDERS = ("fifo", "lifo", "random")


# ---- the reference side (the reference's environment) -----------------------------------------------------------


class StandIn:
    """What the reference's asynchronous root loop calls of its trainer, recorded; its actors finish in `order`."""

    def __init__(self, pt: dict, order: str, out: Path):
        self.cfg = SimpleNamespace(
            output_dir=str(out),
            rl_async_rollout_prefetch_steps=pt["prefetch"],
            grpo_group_size=pt["group"],
            grpo_sample_batch_size=pt["sample"],
            rl_actor_weight_sync="lora",
            rl_actor_weight_sync_interval=pt["interval"],
            log_steps=10**9,
            save_steps=0,
            save_epoch_checkpoints=False,
            grpo_num_sampling_steps=4,
            grpo_train_sample_batch_size=1,
            batch_size=1,
        )
        self.pt, self.order, self.rng = pt, order, random.Random(0)
        total = pt["batches"] * pt["epochs"]
        self.total_steps = min(total, pt["max_steps"]) if pt["max_steps"] else total
        self.train_state = SimpleNamespace(step=0, epoch=0, batch_idx=0)
        self.train_global_ranks = [0]
        self.inference_global_ranks = list(range(1, 1 + pt["actors"]))
        self.rollout_world_size = pt["actors"]
        self.local_world_size = 1 + pt["actors"]
        self.mfu_monitor, self.use_wandb = None, False
        self.trained: list[int] = []
        self.created: list[dict] = []
        self.jobs: list[dict] = []
        self.pending: list[tuple] = []

    def _split_batch_records(self, start_epoch, start_batch_idx):
        import torch

        for epoch in range(start_epoch, self.pt["epochs"]):
            for i in range(start_batch_idx if epoch == start_epoch else 0, self.pt["batches"]):
                yield epoch, i, {"condition": torch.zeros(1, 1)}

    def _select_training_timesteps_for_step(self, steps, step):
        return [0]

    def _collect_actor_policy_state(self, version):
        return {"version": version}

    def _send_async_actor_job(self, actor, job, results, threads):
        state = job["policy_state"]
        self.jobs.append(
            {
                "actor": actor,
                "step": job["step_id"],
                "groups": list(job["groups"]),
                "policy": None if state is None else state["version"],
            }
        )
        self.pending.append((actor, job, results))

    def _split_debug_log(self, message, *args):
        if message.startswith("async_step_created"):
            self.created.append({"step": args[0], "created_after": len(self.trained), "version": args[4]})
        elif message.startswith("async_wait_result_start"):  # the loop waits: one stand-in actor finishes
            index = {"fifo": 0, "lifo": len(self.pending) - 1}.get(self.order)
            if index is None:
                index = self.rng.randrange(len(self.pending))
            actor, job, results = self.pending.pop(index)
            import torch

            chunk = {"groups": job["groups"], "rewards": torch.zeros(1, len(job["groups"]))}
            results.put((actor, {"step_id": job["step_id"], "chunks": [chunk]}))

    def _pack_split_rollouts(self, payloads, B, selected):
        return None

    def _broadcast_train_command(self, command):
        return command

    def _split_train_step_from_rollouts(self, batch, selected_t_idxs, rollouts):
        keys = ("active_rollout_ranks", "policy_loss", "kl_loss", "reward_mean", "reward_std", "advantage_mean")
        return dict.fromkeys(keys, 0.0)

    def _apply_split_optimizer_step(self, step):
        self.trained.append(step)
        return 0.0, 0.0

    def _save_checkpoint(self, path):
        pass

    def _send_async_actor_stop(self, actor):
        self.stopped = getattr(self, "stopped", []) + [actor]


def reference(grid: list[dict], out: Path) -> list[dict]:
    from reference_patches import apply_cpu_patches

    apply_cpu_patches()  # the reference's checkout on the import path, its CUDA-only calls mapped to the CPU
    import src.trainer.dancegrpo_split_runtime as runtime
    from src.trainer.dancegrpo_split_runtime import DanceGRPOSplitRuntimeMixin as Mixin

    runtime.dist = SimpleNamespace(destroy_process_group=lambda: None)  # the loop's last call: no group here
    # The stand-in's methods first, the reference's own (the loop, its prefetch and payload helpers) behind them.
    loop = type("ReferenceLoop", (StandIn, Mixin), {})
    runs = []
    for pt in grid:
        for order in ORDERS:
            trainer = loop(pt, order, out)
            trainer._run_async_split_train_root_loop()
            runs.append(
                {
                    "point": pt,
                    "order": order,
                    "prefetch": trainer._async_prefetch_steps(),
                    "steps": trainer.created,
                    "trained": trainer.trained,
                    "jobs": trainer.jobs,
                }
            )
    return runs


# ---- the comparison (either environment) ------------------------------------------------------------------------


def compare(a: str, b: str) -> int:
    """Print the grid points and orders whose schedules differ; returns their number."""
    ours = {json.dumps(r["point"], sort_keys=True): r for r in json.loads(Path(a).read_text())}
    theirs = json.loads(Path(b).read_text())
    bad, steps = 0, 0
    for run in theirs:
        mine = ours[json.dumps(run["point"], sort_keys=True)]
        problems = []
        if mine["prefetch"] != run["prefetch"]:
            problems.append(f"prefetch {mine['prefetch']} / {run['prefetch']}")
        if run["trained"] != list(range(len(run["steps"]))):
            problems.append(f"the reference trained steps {run['trained']}")
        if mine["steps"] != run["steps"]:
            for x, y in zip(mine["steps"], run["steps"]):
                if x != y:
                    problems.append(
                        f"step {x['step']}: created after {x['created_after']} / {y['created_after']} "
                        f"updates, version {x['version']} / {y['version']}"
                    )
            if len(mine["steps"]) != len(run["steps"]):
                problems.append(f"steps {len(mine['steps'])} / {len(run['steps'])}")
        covered: dict[int, list[int]] = {}
        for job in run["jobs"]:
            covered.setdefault(job["step"], []).extend(job["groups"])
        if any(sorted(g) != list(range(run["point"]["group"])) for g in covered.values()):
            problems.append("the reference's jobs do not cover each step's group members once")
        steps += len(run["steps"])
        if problems:
            bad += 1
            print(run["point"], run["order"], "; ".join(problems[:4]))
    print(
        f"split schedule: {len(theirs)} runs of the reference's asynchronous loop ({len(ours)} grid points x "
        f"{len(ORDERS)} finish orders), {steps} steps: {len(theirs) - bad} agree (prefetch, each step's creation "
        f"point and policy version), {bad} differ"
    )
    example = next(
        r for r in theirs if r["point"]["actors"] == 2 and r["point"]["prefetch"] == 0 and r["order"] == "lifo"
    )
    print(
        f"for example, {example['point']} finishing last in first out; the reference's jobs (actor, step, members,"
        " policy sent):"
    )
    print("  " + ", ".join(f"({j['actor']}, {j['step']}, {j['groups']}, {j['policy']})" for j in example["jobs"][:12]))
    return bad


def store(b: str, out: str, commit: str) -> None:
    """The reference's runs, compact, for tests/test_actor_schedule.py: per grid point (in GRID's order) its prefetch
    and, per step, [the updates taken when it was created, its policy version]; once, refused if the finish orders
    gave different schedules (then the reference's versions would hang on timing)."""
    by_point: dict[str, list] = {}
    for run in json.loads(Path(b).read_text()):
        key = json.dumps(run["point"], sort_keys=True)
        assert [s["step"] for s in run["steps"]] == list(range(len(run["steps"])))
        kept = [run["prefetch"], [[s["created_after"], s["version"]] for s in run["steps"]]]
        if by_point.setdefault(key, kept) != kept:
            raise SystemExit(f"{run['point']}: the reference's schedule differs between finish orders")
    runs = [by_point[json.dumps(pt, sort_keys=True)] for pt in GRID]
    text = json.dumps({"reference_commit": commit, "orders": list(ORDERS), "runs": runs}, separators=(",", ":"))
    Path(out).write_text(text)
    print(f"split-store: {len(runs)} grid points into {out} ({len(text)} bytes)")


def stored_steps(run: list) -> tuple[int, list[dict]]:
    """(prefetch, steps) of one stored run, in the comparison's form."""
    prefetch, steps = run
    return prefetch, [{"step": i, "created_after": c, "version": v} for i, (c, v) in enumerate(steps)]
