"""The trainer under torchrun (2 or 4 gloo processes, tiny model): the replay plan, resume after SIGKILL,
FSDP layouts (HSDP's: tests/test_prompts_per_rank.py), metrics reduced over ranks, float32 master weights, the
timestep the sharded transformer receives and peak memory (tests/probe_worker.py), and learning against a placebo."""

from __future__ import annotations

import math
import re

import pytest
import torch

from videogrpo import config
from videogrpo.grpo import replay
from videogrpo.grpo.trainer import run_plan

from harness import (
    adam_tolerance,
    launch,
    layout,
    metrics,
    solo_config,
    tensors,
    train,
    train_in_process,
    trainer_config,
    weights,
    without_times,
)


def checkpoint_exists(update: int):
    return lambda out: (out / f"checkpoints/step-{update:08d}/COMPLETE").exists()


def metric_lines_at_least(n: int):
    path = "checkpoints/metrics.jsonl"
    return lambda out: (out / path).exists() and len((out / path).read_text().splitlines()) >= n


# One prompt per step shared by both ranks: 6 batches per epoch, so the plan has prefills, steady
# one-stale updates, flushes at checkpoints (every 3 updates) and at epoch ends that skip a batch.
DELAYED_FSDP = dict(
    grpo={"delayed_replay": True, "prompts_per_step": 1},
    parallel={"data_parallel": "fsdp"},
    train={"max_steps": None, "epochs": 2, "save_steps": 3, "warmup_steps": 2},
)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    assert train(trainer_config(**DELAYED_FSDP), out, tiny_model, dataset)
    return out


def test_the_trainer_runs_the_replay_plan(uninterrupted):
    cfg = config.from_dict(trainer_config(**DELAYED_FSDP))
    actions = run_plan(cfg, num_samples=6)
    lines = metrics(uninterrupted)
    planned = [a for a in actions if a.update is not None]
    assert len(lines) == replay.total_updates(actions) == len(planned) == 8
    assert [m["step"] for m in lines] == [a.update for a in planned]
    assert [m["delayed_replay_staleness"] for m in lines] == [a.staleness for a in planned]
    assert {m["delayed_replay_staleness"] for m in lines} == {0.0, 1.0}
    assert [m["replayed_batch"] for m in lines] == [a.replay for a in planned]  # one batch per update
    rolled_out = [b for m in lines for b in m["rolled_out_batches"]]
    skipped = [a.batch for a in actions if not a.prepare]
    assert rolled_out == [a.batch for a in actions if a.prepare] and skipped == [3, 5, 8, 11]
    assert not set(rolled_out) & set(skipped)  # a batch a flush skips is never rolled out
    assert all(m["ppo_clip_range"] == 0.01 for m in lines)  # the delayed clip range


def test_the_learning_rate_of_every_update_is_warm_up_then_cosine(uninterrupted):
    lines = metrics(uninterrupted)
    peak, warmup, total = 1e-4, 2, len(lines)
    for m in lines:
        k = m["step"] - 1
        expected = (
            peak * k / warmup if k < warmup else peak * 0.5 * (1 + math.cos(math.pi * (k - warmup) / (total - warmup)))
        )
        assert m["learning_rate"] == pytest.approx(expected, rel=1e-12, abs=1e-20), m["step"]


def test_the_ppo_ratio_is_exactly_one_on_policy_and_only_then(uninterrupted):
    lines = metrics(uninterrupted)
    rate = {m["step"]: m["learning_rate"] for m in lines}

    def policy_unchanged(m):  # no update since the rollout, or only updates at learning rate 0 (warm-up's first)
        return all(rate[m["step"] - i] == 0 for i in range(1, int(m["delayed_replay_staleness"]) + 1))

    fresh = [m for m in lines if policy_unchanged(m)]
    stale = [m for m in lines if not policy_unchanged(m)]
    assert fresh and stale and any(m["delayed_replay_staleness"] > 0 for m in fresh)
    for m in fresh:
        assert m["ppo_ratio_mean"] == 1.0 and m["ppo_ratio_abs_max"] == 0.0 and m["ppo_approx_kl"] == 0.0
        # At ratio 1 the loss is -mean(A) over every rank's rollouts, not over rank 0's share.
        assert m["policy_loss"] == pytest.approx(-m["advantage_mean"], abs=1e-6)
    for m in stale:
        assert m["ppo_ratio_abs_max"] > 0.0 and m["ppo_ratio_mean"] != 1.0


def test_the_workers_die_with_a_sigkilled_torchrun(tiny_model, dataset, tmp_path):
    """torchrun puts each worker in a session of its own: killed alone (the OOM killer), it must not leave them
    training and writing checkpoints beside the next attempt's."""
    import os
    import signal
    import time

    import psutil

    proc = launch(trainer_config(**DELAYED_FSDP), tmp_path, tiny_model, dataset)
    deadline = time.monotonic() + 300
    while not metric_lines_at_least(1)(tmp_path):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
        time.sleep(0.05)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert len(workers) >= 2  # the two ranks
    os.kill(proc.pid, signal.SIGKILL)  # torchrun only, not its process group or the workers' sessions
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    for worker in alive:
        worker.kill()
    assert not alive, [w.pid for w in alive]
    assert not (tmp_path / "final").exists()


@pytest.mark.parametrize(
    "kill_when", [checkpoint_exists(3), metric_lines_at_least(5)], ids=["after-first-checkpoint", "between-checkpoints"]
)
def test_sigkill_then_rerun_resumes_and_ends_bit_identical(uninterrupted, tiny_model, dataset, tmp_path, kill_when):
    cfg = trainer_config(**DELAYED_FSDP)
    assert not train(cfg, tmp_path, tiny_model, dataset, kill_when=kill_when)
    assert not (tmp_path / "final").exists()
    assert train(cfg, tmp_path, tiny_model, dataset)
    log = (tmp_path / "log.txt").read_text()
    assert "resumed from" in log
    # The run's length says which limit set it (replay.describe, tests/test_replay.py).
    assert re.search(r"\d+ updates in \d+ batches \(delayed replay\): .*train\.(epochs|max_steps) = \d+", log), log
    assert weights(tmp_path) == weights(uninterrupted)
    assert without_times(metrics(tmp_path)) == without_times(metrics(uninterrupted))


def test_fsdp_shards_every_parameter_and_trains_what_replicate_trains(uninterrupted, tiny_model, dataset, tmp_path):
    sharded = layout(uninterrupted)
    assert sharded["sharded"] == sharded["parameters"] > 0 and sharded["dtypes"] == ["float32"]
    assert sharded["mesh_shape"] == [2] and sharded["mesh_dims"] == ["shard"]
    assert sharded["local_fraction"] == pytest.approx(0.5, abs=0.02)  # each rank holds half of every weight
    cfg = trainer_config(**dict(DELAYED_FSDP, parallel={"data_parallel": "replicate"}))
    assert train(cfg, tmp_path, tiny_model, dataset)
    assert layout(tmp_path)["sharded"] == 0
    a, b = tensors(tmp_path), tensors(uninterrupted)
    assert a.keys() == b.keys()
    for key in a:
        # FSDP's reduce-scatter divides before summing where replicate sums then divides (seen: 2e-6).
        assert (a[key] - b[key]).abs().max() <= adam_tolerance(1e-4, 8), key


def test_metrics_are_reduced_over_all_ranks(uninterrupted, tiny_model, dataset, tmp_path):
    """The same run in a world of one logs what the two ranks log together (each holds half of each group)."""
    cfg = solo_config(**{k: v for k, v in DELAYED_FSDP.items() if k != "parallel"})
    cfg["parallel"]["data_parallel"] = "replicate"
    one = metrics(train_in_process(cfg, tmp_path, tiny_model, dataset))
    two = metrics(uninterrupted)
    assert [m["step"] for m in one] == [m["step"] for m in two]
    for a, b in zip(one, two):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-4)
        for key in ("policy_loss", "ppo_approx_kl", "kl_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-2, abs=1e-7), (key, a["step"])
        for key in ("ppo_ratio_mean", "ppo_ratio_abs_max", "ppo_clip_fraction"):
            assert a[key] == pytest.approx(b[key], rel=1e-2, abs=1e-6), (key, a["step"])


MASTER_LR = 5e-6


def first_adam_steps(out, initial: dict, weight_decay: float) -> dict:
    """Per parameter, (p0 (1 - lr wd) - p1) / lr in float64: AdamW's first step is lr g / (|g| + eps) after the
    decay, so this is in [-1, 1], near +-1 where |g| is well above eps (seen: over half of lr for 99 % of the
    weights). Rounded (bf16) masters would show their rounding error instead: up to 2^-9 |p|, hundreds of lr."""
    final = tensors(out)
    return {
        k: (v.double() * (1 - MASTER_LR * weight_decay) - final[k].double()) / MASTER_LR for k, v in initial.items()
    }


def test_bf16_compute_updates_float32_master_weights(tiny_model, dataset, tmp_path):
    """One update at lr 5e-6 under bf16 compute, in each parallel mode: the parameters are float32 and move by
    AdamW's first step (lr per weight), although for most weights lr is below bf16's resolution (a bf16 copy
    would not change)."""
    from safetensors.torch import load_file

    initial = load_file(tiny_model / "transformer/diffusion_pytorch_model.safetensors")
    one = dict(train={"lr": MASTER_LR, "warmup_steps": 0, "max_steps": 1, "save_steps": 1000})
    bf16 = {"param_dtype": "bfloat16"}
    runs = {"replicate-autocast": tmp_path / "replicate"}
    train_in_process(solo_config(parallel=bf16, **one), runs["replicate-autocast"], tiny_model, dataset)
    for mode, extra in (("fsdp", {}), ("hsdp", {"shard_group_size": 2})):
        runs[mode] = tmp_path / mode
        cfg = trainer_config(parallel=dict(bf16, data_parallel=mode, **extra), **one)
        assert train(cfg, runs[mode], tiny_model, dataset)
    weight_decay = config.from_dict(trainer_config()).train.weight_decay
    total = sum(v.numel() for v in initial.values())
    # The update is below bf16's resolution for most weights: bf16 masters would round it away.
    moved_in_bf16 = sum(
        int(((w.float() - MASTER_LR * torch.sign(w.float())).bfloat16() != w).sum())
        for w in (v.bfloat16() for v in initial.values())
    )
    assert moved_in_bf16 / total < 0.05, moved_in_bf16 / total  # seen: 1.6 %
    for mode, out in runs.items():
        shown = layout(out)
        assert shown["dtypes"] == ["float32"], (mode, shown)
        assert shown["sharded"] == (0 if mode.startswith("replicate") else shown["parameters"]), (mode, shown)
        steps = first_adam_steps(out, initial, weight_decay)
        largest = max(float(s.abs().max()) for s in steps.values())
        moved = sum(int((s.abs() > 0.5).sum()) for s in steps.values()) / total
        print(f"{mode}: largest step {largest:.4f} lr, {moved:.4f} of the weights moved by more than lr / 2")
        assert largest < 1.05, (mode, largest)  # nothing moved by more than one AdamW step: no rounding
        assert moved > 0.95, (mode, moved)  # and nearly every weight moved by that tiny step


# With shift 5 and 4 steps, sigma x 1000 is 1000, 937.5, 833.33 and 625; bf16 holds 1000, 936, 832 and 624.
EXACT = [0.0, 625.0, float(torch.tensor(2500 / 3, dtype=torch.float32)), 937.5, 1000.0]
IN_BF16 = [0.0, 624.0, 832.0, 936.0, 1000.0]


# Each sharding mode and each trajectory dtype once ("compute" resolves to bfloat16 here): FSDP2's input cast is
# the same hook under both modes, so the other two pairings added two 2-rank launches (52 CPU-s) and no case.
@pytest.mark.parametrize(
    "mode, trajectory, received",
    [
        ("fsdp", "compute", ("bfloat16", IN_BF16)),
        ("hsdp", "float32", ("float32", EXACT)),
    ],
)
def test_the_sharded_transformer_receives_the_timestep_in_the_trajectory_dtype(
    tiny_model, dataset, tmp_path, mode, trajectory, received
):
    """Under bf16 compute FSDP2 casts a module's floating inputs to the compute dtype; the transformer's own
    inputs must stay as handed over: the timestep in grpo.trajectory_dtype, in rollouts and replays.

    The same two-rank runs check peak memory: reset where each update's period starts and max-reduced
    over the ranks (tests/probe_worker.py stands in for CUDA's counters).
    """
    import json

    cfg = trainer_config(
        parallel={"data_parallel": mode, "shard_group_size": 2, "param_dtype": "bfloat16"},
        grpo={"trajectory_dtype": trajectory, "sampling_steps": 4, "timestep_fraction": 1.0},
        train={"max_steps": 2, "save_steps": 1000},
    )
    assert train(cfg, tmp_path, tiny_model, dataset, worker="probe_worker")
    dtype, values = received
    for rank in (0, 1):
        probe = json.loads((tmp_path / f"probe-rank{rank}.json").read_text())
        forwards = probe["forwards"]
        rollouts = [f for f in forwards if f["phase"] == "rollout"]
        replays = [f for f in forwards if f["phase"] == "replay"]
        assert len(rollouts) == 2 * 4 and len(replays) == 2 * 3, forwards  # 2 updates: 4 steps, 3 trained
        for f in forwards:
            assert (f["timestep_dtype"], f["hidden_dtype"]) == (dtype, "bfloat16"), f
        assert sorted({v for f in rollouts for v in f["timesteps"]}) == values
        assert sorted({v for f in replays for v in f["timesteps"]}) == [values[0], *values[2:]]  # the first 3 steps
        assert probe["resets"] == 2  # once per update
    # Rank 1 reads 2000 + its resets so far, rank 0 1000 + its resets: the log shows the larger.
    assert [m["peak_memory_bytes"] for m in metrics(tmp_path)] == [2001, 2002]


def test_grpo_learns_the_synthetic_tasks_beyond_a_placebo(tiny_model, dataset, tmp_path):
    """A real improvement of the EvalKit reward on the synthetic tasks, against a paired placebo run.

    The placebo (grpo.shuffle_advantages) is the same run with each group's advantages permuted among
    its members: the same rollouts, rewards and step sizes, but no credit assignment. At 5 frames of
    32 x 32 (two latent frames of 2 x 2) the policy-gradient estimate of 8 rollouts per group is
    informative enough to learn within a CI budget; at the demo's 17 x 64 x 64 it is not (see
    bench/RESULTS.md). Every epoch visits the same 6 prompts in the same order, so the first and the
    last epochs are comparable.
    """
    gains = {}
    for name, shuffle in (("grpo", False), ("placebo", True)):
        cfg = trainer_config(
            train={"lr": 2e-2, "epochs": 20, "max_steps": None, "save_steps": 1000},
            grpo={"group_size": 8, "shuffle_advantages": shuffle},
            video={"num_frames": 5, "height": 32, "width": 32},
            evalkit={"video_size": 64},
        )
        assert train(cfg, tmp_path / name, tiny_model, dataset)
        rewards = [m["reward_mean"] for m in metrics(tmp_path / name)]
        per_epoch = len(rewards) // 20
        first = sum(rewards[: 2 * per_epoch]) / (2 * per_epoch)
        last = sum(rewards[-2 * per_epoch :]) / (2 * per_epoch)
        gains[name] = last - first
        print(f"LEARN {name}: first two epochs {first:.4f}, last two {last:.4f}, gain {last - first:+.4f}")
    assert gains["grpo"] > 0.02 and gains["grpo"] > gains["placebo"] + 0.015, gains


def test_ctrl_c_is_an_interruption_not_a_failing_rank(tiny_model, dataset, tmp_path):
    """SIGINT to the process group (what Ctrl-C sends): every rank says it was interrupted and keeps its checkpoints."""
    import os
    import signal
    import time

    from harness import launch

    cfg = trainer_config(train={"max_steps": 50, "epochs": 50, "save_steps": 1})
    proc = launch(cfg, tmp_path, tiny_model, dataset)
    deadline = time.monotonic() + 300
    while proc.poll() is None and not (tmp_path / "checkpoints/step-00000001/COMPLETE").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    log = (tmp_path / "log.txt").read_text()
    for rank in (0, 1):
        assert f"[rank {rank}] interrupted; complete checkpoints are kept, rerun to resume" in log, log[-3000:]
    assert "KeyboardInterrupt" not in log and "] error:" not in log, log[-3000:]  # no rank or scorer died of it
    assert (tmp_path / "checkpoints/step-00000001/COMPLETE").exists()
