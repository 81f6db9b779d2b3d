"""Rollout actor ranks (the `actors` section, docs/options.md#rollout-actors): some ranks train, the others roll
out and score for them.

A stalled actor (SIGSTOP after update 1's checkpoint) is noticed within actors.stall_timeout_s: the run stops with
an error naming its rank and node, and a plain rerun resumes from the checkpoint to the uninterrupted run's weights.

Synchronous: the same tiny run on 2 ranks that roll out and train, and on 3 ranks of which 2 train and 1 rolls out
(weights sent whole after every update): the draws are keyed by batch, prompt and member, and the train ranks
replay the rows a 2-rank job replays, so the rewards, advantages, losses and weights are the same to round-off, and
every update is on-policy (the ratio exactly 1). With no weights sent (`weight_sync: none`) the actor rolls out the
initial weights: the first update is the same, the later ones are off-policy.
"""

from __future__ import annotations

import contextlib
import socket
import time

import psutil
import pytest

from harness import kill_tree, launch, metrics, tensors, train, trainer_config

SYNC = dict(grpo={"prompts_per_step": 2}, train={"max_steps": 3, "epochs": 2, "save_steps": 0})


def test_a_synchronous_actor_makes_the_updates_of_the_train_ranks_alone(tiny_model, dataset, tmp_path):
    runs = {}
    for name, procs, actors in (
        ("alone", 2, {}),
        ("actor", 3, {"train_ranks": 2}),
        ("stale", 3, {"train_ranks": 2, "weight_sync": "none"}),
    ):
        cfg = trainer_config(**SYNC)
        cfg["parallel"].update(procs_per_node=procs, data_parallel="replicate")
        cfg["actors"] = actors
        assert train(cfg, tmp_path / name, tiny_model, dataset)
        runs[name] = metrics(tmp_path / name), tensors(tmp_path / name)
    log = (tmp_path / "actor/log.txt").read_text()
    assert "rollout actors: ranks 0..1 train, ranks 2..2 (1) roll out and score, synchronous" in log
    (alone, alone_weights), (split, split_weights) = runs["alone"], runs["actor"]
    assert [m["step"] for m in split] == [m["step"] for m in alone] == [1, 2, 3]
    for a, b in zip(alone, split):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6), a["step"]
        assert a["advantage_mean"] == pytest.approx(b["advantage_mean"], abs=1e-6), a["step"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
        assert b["ppo_ratio_abs_max"] == 0.0, b["step"]  # on-policy: the actor held the update's weights
    for name, weight in alone_weights.items():
        assert (weight - split_weights[name]).abs().max() <= 1e-6, name
    stale, _ = runs["stale"]
    assert stale[0]["reward_mean"] == alone[0]["reward_mean"] and stale[0]["ppo_ratio_abs_max"] == 0.0
    assert all(m["ppo_ratio_abs_max"] > 0 for m in stale[1:])  # rolled out by the initial weights

    # The actor stalls after update 1's checkpoint: the train ranks give up on it within the stall timeout.
    cfg = trainer_config(grpo=SYNC["grpo"], train=dict(SYNC["train"], save_steps=1))
    cfg["parallel"].update(procs_per_node=3, data_parallel="replicate")
    cfg["actors"] = {"train_ranks": 2, "stall_timeout_s": 10}
    out = tmp_path / "stalled"
    proc = launch(cfg, out, tiny_model, dataset)
    actor = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and not (out / "checkpoints/step-00000001/COMPLETE").exists():
            assert time.monotonic() < deadline, (out / "log.txt").read_text()[-3000:]
            time.sleep(0.05)
        actor = actor_process(proc)
        actor.suspend()  # SIGSTOP: alive, silent
        started = time.monotonic()
        assert proc.wait(timeout=120) != 0
        waited = time.monotonic() - started
    finally:
        if actor is not None:  # torchrun kills it once the train ranks have stopped; else it goes on
            with contextlib.suppress(psutil.NoSuchProcess):
                actor.resume()
        if proc.poll() is None:
            kill_tree(proc)
    log = (out / "log.txt").read_text()
    named = f"nothing from rank 2 (on {socket.gethostname()}) while waiting for the rollouts of batch"
    assert named in log, log[-3000:]
    assert "actors.stall_timeout_s = 10 s" in log and waited < 60
    # A plain rerun resumes from update 1's checkpoint and ends with the uninterrupted run's weights.
    cfg["actors"]["stall_timeout_s"] = 600
    assert train(cfg, out, tiny_model, dataset)
    assert "starting at batch 1" in (out / "log.txt").read_text()
    resumed = tensors(out)
    for name, weight in split_weights.items():
        assert (weight - resumed[name]).abs().max() <= 1e-6, name


def test_two_actors_under_delayed_replay_make_the_updates_of_the_train_ranks_alone(tiny_model, dataset, tmp_path):
    """Two actors (pieces dealt in turn), FSDP train ranks, delayed replay with two shuffled updates a batch: each
    batch is rolled out under the weights of the update before it, as the train ranks alone roll it out."""
    delayed = dict(
        grpo={"prompts_per_step": 2, "delayed_replay": True, "updates_per_batch": 2, "sample_batch_size": 2},
        train={"max_steps": None, "epochs": 1, "save_steps": 0},
    )
    runs = {}
    for name, procs, actors in (("alone", 2, {}), ("actors", 4, {"train_ranks": 2})):
        cfg = trainer_config(**delayed)
        cfg["parallel"].update(procs_per_node=procs, data_parallel="fsdp")
        cfg["actors"] = actors
        assert train(cfg, tmp_path / name, tiny_model, dataset)
        runs[name] = metrics(tmp_path / name), tensors(tmp_path / name)
    (alone, alone_weights), (split, split_weights) = runs["alone"], runs["actors"]
    assert [m["delayed_replay_staleness"] for m in split] == [m["delayed_replay_staleness"] for m in alone]
    for a, b in zip(alone, split, strict=True):
        assert a["grad_norm_per_update"] == pytest.approx(b["grad_norm_per_update"], rel=1e-5), a["step"]
    for name, weight in alone_weights.items():
        assert (weight - split_weights[name]).abs().max() <= 1e-6, name


def test_asynchronous_actors_roll_out_ahead_within_the_bound_and_resume_exactly(tiny_model, dataset, tmp_path):
    """2 train ranks (FSDP) and 2 actors, asynchronous: prefetch by the reference's formula (2 actors, a whole group
    a job: 3), weights collected every 2 updates, so batch n is rolled out under the weights of update
    (n - 2) rounded down to even: versions 0 0 0 0 2 2, staleness 0 1 2 3 2 3 (at most 3). The ratio is taken
    against the actors' own log-probabilities: exactly 1 where the batch is fresh, not where it is stale.

    One actor is killed (SIGKILL) once update 2's checkpoint is complete, with batches 2 to 4 dealt (batch 3's
    rolled out under version 0, which the checkpoint keeps). The run stops with an error; a plain rerun resumes
    mid-epoch, deals them again under the same weights, and makes the uninterrupted run's updates: no batch
    skipped or repeated, the same versions, the same final weights."""
    cfg = trainer_config(grpo={"prompts_per_step": 2}, train={"max_steps": None, "epochs": 2, "save_steps": 2})
    cfg["parallel"].update(procs_per_node=4, data_parallel="fsdp")
    cfg["actors"] = {"train_ranks": 2, "asynchronous": True, "sync_interval": 2, "stall_timeout_s": 30}
    whole = tmp_path / "whole"
    assert train(cfg, whole, tiny_model, dataset)
    log = (whole / "log.txt").read_text()
    assert "asynchronous, prefetch 3, weights collected every 2 update(s), staleness at most 3" in log
    rows = metrics(whole)
    assert [m["replayed_batch"] for m in rows] == [0, 1, 2, 3, 4, 5]
    assert [m["rollout_policy_version"] for m in rows] == [0, 0, 0, 0, 2, 2]
    assert [m["rollout_staleness"] for m in rows] == [0, 1, 2, 3, 2, 3]
    for m in rows:
        assert (m["ppo_ratio_abs_max"] == 0.0) == (m["rollout_staleness"] == 0), m["step"]

    out = tmp_path / "killed"
    proc = launch(cfg, out, tiny_model, dataset)
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and not (out / "checkpoints/step-00000002/COMPLETE").exists():
            assert time.monotonic() < deadline, (out / "log.txt").read_text()[-3000:]
            time.sleep(0.05)
        actor_process(proc, 3).kill()
        started = time.monotonic()
        assert proc.wait(timeout=120) != 0
        assert time.monotonic() - started < 60
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert "Signal 9 (SIGKILL)" in (out / "log.txt").read_text()
    assert train(cfg, out, tiny_model, dataset)
    resumed_log = (out / "log.txt").read_text()
    assert "starting at batch 2" in resumed_log or "starting at batch 4" in resumed_log, resumed_log[-3000:]
    again = metrics(out)
    for key in ("replayed_batch", "rollout_policy_version", "rollout_staleness", "rolled_out_batches"):
        assert [m[key] for m in again] == [m[key] for m in rows], key
    for a, b in zip(rows, again, strict=True):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), a["step"]
    expected = tensors(whole)
    for name, weight in tensors(out).items():
        assert (weight - expected[name]).abs().max() <= 1e-6, name


def test_lora_adapters_alone_reach_actors_of_fsdp_train_ranks(tiny_model, dataset, tmp_path):
    """LoRA on FSDP-sharded train ranks: the adapters are gathered whole and sent alone (`auto` is `lora`), the
    actor adds the same adapters to its base and loads them by name; the updates are the train ranks' alone."""
    runs = {}
    for name, procs, actors in (("alone", 2, {}), ("actor", 3, {"train_ranks": 2})):
        cfg = trainer_config(
            grpo=SYNC["grpo"], train=dict(SYNC["train"], max_steps=2, lora_rank=4, lora_export_merged=True)
        )
        cfg["parallel"].update(procs_per_node=procs, data_parallel="fsdp")
        cfg["actors"] = actors
        assert train(cfg, tmp_path / name, tiny_model, dataset)
        runs[name] = metrics(tmp_path / name), tensors(tmp_path / name)
    assert "weights sent as lora" in (tmp_path / "actor/log.txt").read_text()
    (alone, alone_weights), (split, split_weights) = runs["alone"], runs["actor"]
    for a, b in zip(alone, split, strict=True):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4) and b["ppo_ratio_abs_max"] == 0.0, a["step"]
    for name, weight in alone_weights.items():
        assert (weight - split_weights[name]).abs().max() <= 1e-6, name


@pytest.fixture(scope="module")
def tiny_i2v(tmp_path_factory):
    from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline

    out = tmp_path_factory.mktemp("i2v") / "pipeline"
    save_tiny_i2v_pipeline(out, 0)
    return out


def test_the_a14b_experts_on_an_actor_make_the_updates_of_the_train_ranks_alone(tiny_i2v, dataset, tmp_path):
    """The tiny A14B (config/tiny_a14b.yaml: two experts routed by timestep, one eta per prompt) without tensor
    parallelism: the actor holds both experts whole and frozen, each step routed as on a train rank, and receives
    both experts' trained tensors by `high.` and `low.` names; the updates are those of the 2 FSDP train ranks
    alone."""
    import yaml

    from conftest import REPO

    a14b = yaml.safe_load((REPO / "config/tiny_a14b.yaml").read_text())
    runs = {}
    for name, procs, actors in (("alone", 2, {}), ("actor", 3, {"train_ranks": 2})):
        cfg = trainer_config()
        for section, values in a14b.items():
            cfg[section] = dict(cfg[section], **values) if isinstance(values, dict) else values
        cfg["train"].update(max_steps=2, save_steps=0)
        cfg["parallel"].update(procs_per_node=procs, tensor_parallel=1, data_parallel="fsdp")
        cfg["actors"] = actors
        assert train(cfg, tmp_path / name, tiny_i2v, dataset)
        runs[name] = metrics(tmp_path / name)
    (alone, split) = runs["alone"], runs["actor"]
    for a, b in zip(alone, split, strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
        assert b["ppo_ratio_abs_max"] == 0.0, b["step"]
    for expert in ("transformer", "transformer_2"):  # the high- and low-noise experts' exports
        path = f"final/{expert}/diffusion_pytorch_model.safetensors"
        from safetensors.torch import load_file

        mine, theirs = load_file(tmp_path / "actor" / path), load_file(tmp_path / "alone" / path)
        for key, weight in theirs.items():
            assert (weight - mine[key]).abs().max() <= 1e-6, (expert, key)


def actor_process(proc, rank: int = 2):
    """The worker process of job rank `rank` (an actor) under torchrun `proc`."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "videogrpo.grpo.worker" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no worker of rank {rank} under torchrun")


@pytest.mark.parametrize(
    ("actors", "settings", "refused"),
    [
        ({"train_ranks": 1, "train_nodes": 1}, {}, r"set one of the two"),
        ({"train_ranks": 2}, {}, r"leave none of the 2 ranks .* to roll out"),
        ({"train_ranks": 1, "weight_sync": "lora"}, {}, r"'lora' without LoRA .* use 'full' or 'auto'"),
        ({"train_ranks": 1, "asynchronous": True, "prefetch": 0}, {}, r"actors.prefetch"),
        ({"train_ranks": 2}, {"parallel": {"procs_per_node": 4, "tensor_parallel": 2}}, r"tensor_parallel = 2: not"),
        ({"train_ranks": 1, "weight_sync": "some"}, {}, r"actors.weight_sync"),
        ({"train_ranks": 1, "stall_timeout_s": 0}, {}, r"actors.stall_timeout_s"),
        # The train ranks alone must make a valid topology: 3 ranks with 2 training, one prompt per rank a wave.
        ({"train_ranks": 2}, {"parallel": {"procs_per_node": 3}, "grpo": {"prompts_per_step": 3}}, r"2 train ranks"),
    ],
)
def test_what_actors_cannot_do_is_refused_with_the_reason(actors, settings, refused):
    from videogrpo import config
    from videogrpo.errors import ConfigError

    from conftest import REPO

    with pytest.raises(ConfigError, match=refused):
        config.load([REPO / "config/config.yaml"], {"actors": actors, **settings})


def test_which_ranks_train_is_the_topology_of_the_run_identity():
    """Which ranks train is part of the topology, as the ranks' count is; how long a rank waits for an actor is not.
    Without actors the section is off: no run's identity names it."""
    from videogrpo import config

    from conftest import REPO

    def identity(procs: int, **actors):
        cfg = config.load([REPO / "config/config.yaml"], {"parallel": {"procs_per_node": procs}, "actors": actors})
        return config.run_identity(cfg)

    actor = identity(3, train_ranks=2)
    assert actor == identity(3, train_ranks=2, stall_timeout_s=5)
    assert len({identity(2), actor, identity(3, train_ranks=2, weight_sync="none"), identity(4, train_ranks=2)}) == 4
    assert identity(2) == identity(2, stall_timeout_s=5, weight_sync="none")  # no actors: the section is off

    # Asynchronous with the automatic prefetch: the prefetch it resolves to is the run's, though the rollout chunk it
    # reads (grpo.sample_batch_size) is an execution field. 3 actors, 4 members a group: a whole group a job gives
    # 3 + 1 = 4, one member a job ceil(3 / 4) + 1 = 2.
    def chunked(size, **actors):
        cfg = config.load(
            [REPO / "config/config.yaml"],
            {"parallel": {"procs_per_node": 4}, "grpo": {"sample_batch_size": size}, "actors": actors},
        )
        return config.run_identity(cfg)

    auto = {"train_ranks": 1, "asynchronous": True}
    assert chunked(None, **auto) == chunked(4, **auto) == chunked(1, prefetch=4, **auto)
    assert chunked(1, **auto) == chunked(None, prefetch=2, **auto) != chunked(None, **auto)


def test_simulate_accepts_actors_at_the_5b_recipes_world_size():
    """The 5B recipe's 128 ranks, the first 8 nodes training and the other 8 rolling out: the train ranks are
    simulated as a 64-rank job (rank 0 and the last train rank), and the actors are named beside them (the command
    docs/options.md#rollout-actors shows)."""
    from demo import run

    from conftest import REPO

    argv = ["videogrpo", "simulate", "--configfile", "config/recipes/rl_5b_cps.yaml", "--set", "actors.train_nodes=8"]
    out = run([*argv, "--ranks", "0,63", "--no-steps"], REPO)
    assert "the 64 train ranks of 128 (the others are rollout actors)" in out.stdout
    assert "2 ranks of 64 checked" in out.stdout and "64 rollout actors beside them" in out.stdout
    refused = run([*argv, "--ranks", "64", "--no-steps"], REPO, check=False)
    assert refused.returncode != 0 and "the world size is 64 (ranks 0 to 63)" in refused.stdout + refused.stderr
