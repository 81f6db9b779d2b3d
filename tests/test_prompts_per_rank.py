"""Fewer ranks than prompts in shared-prompt mode: a rank serves several prompts of a wave, one after another,
and the optimizer step is the one the release topology takes (docs/reference-system.md#shared-prompt-waves).

The same tiny run on 1, 2 and 4 ranks (4: two ranks per prompt, as the 5B recipes at 128 GPUs; 2: one prompt a
rank; 1: both prompts on one rank), synchronous and under delayed replay (with two updates a batch), under the
layouts the recipes use (HSDP, FSDP; replicate for the world of one): the same advantages, losses, gradient norms
and weights to round-off.
"""

from __future__ import annotations

import pytest

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.grpo import assignment

from conftest import REPO
from harness import adam_tolerance, layout, metrics, tensors, train, train_in_process, trainer_config

LAYOUTS = {
    1: {"procs_per_node": 1, "data_parallel": "replicate"},
    2: {"procs_per_node": 2, "data_parallel": "fsdp"},
    4: {"procs_per_node": 4, "data_parallel": "hsdp", "shard_group_size": 2},
}
# Two prompts a step over 6 training samples: 3 batches an epoch. Delayed: a prefill, an update replaying the slot,
# and a flush at the epoch's end that replays the slot and skips its own batch (updates 0 and 1 stale). It also
# takes two updates a batch on shuffled halves, replayed two members at a time: the halves split a prompt's members
# unevenly over the ranks that share it, so the FSDP and HSDP ranks pad (grpo.minibatches).
MODES = {
    "sync": dict(grpo={"prompts_per_step": 2}, train={"max_steps": 3, "epochs": 2, "save_steps": 0}),
    "delayed": dict(
        grpo={"prompts_per_step": 2, "delayed_replay": True, "updates_per_batch": 2, "sample_batch_size": 2},
        train={"max_steps": None, "epochs": 1, "save_steps": 0},
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_one_two_and_four_ranks_make_the_same_updates(mode, tiny_model, dataset, tmp_path):
    runs = {}
    for world, parallel in LAYOUTS.items():
        cfg = trainer_config(**MODES[mode])
        cfg["parallel"].update(parallel)
        out = tmp_path / f"world{world}"
        if world == 1:
            train_in_process(cfg, out, tiny_model, dataset)
        else:
            assert train(cfg, out, tiny_model, dataset)
        runs[world] = metrics(out), tensors(out)
    log = (tmp_path / "world2/log.txt").read_text()
    assert "rank 0 rolls out 4 member(s) of each of 1 prompt(s) a batch" in log
    # HSDP at 4 ranks: 2 shard groups of 2 ranks (a 2-D mesh), every parameter sharded within its group.
    hsdp = layout(tmp_path / "world4")
    assert hsdp["sharded"] == hsdp["parameters"] and hsdp["mesh_shape"] == [2, 2]
    assert hsdp["mesh_dims"] == ["replicate", "shard"] and hsdp["local_fraction"] == pytest.approx(0.5, abs=0.02)
    assert layout(tmp_path / "world1")["sharded"] == 0
    one, one_weights = runs[1]
    updates = len(one)
    assert updates == (3 if mode == "sync" else 2)
    assert {m["delayed_replay_staleness"] for m in one} == ({0.0} if mode == "sync" else {0.0, 1.0})
    assert [m.get("optimizer_updates", 1) for m in one] == [1 if mode == "sync" else 2] * updates
    for world in (2, 4):
        lines, weights = runs[world]
        assert [m["step"] for m in lines] == [m["step"] for m in one]
        assert [m["replayed_batch"] for m in lines] == [m["replayed_batch"] for m in one]
        for a, b in zip(one, lines):
            where = (world, a["step"])
            # The first update's rollouts are the same draws of the same weights: the same rewards, bit for bit.
            if a["step"] == 1:
                assert a["reward_mean"] == b["reward_mean"] and a["advantage_mean"] == b["advantage_mean"], where
            # Later ones follow weights that differ by round-off; decoding to 8-bit video can flip a pixel (seen:
            # 1.6e-5 in the mean reward after four updates).
            assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-3), where
            # The gradient's norm shows a wrong loss normaliser or a prompt left out (AdamW's step would hide a
            # scale); seen within 1e-4 relative.
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), where
            if "grad_norm_per_update" in a:  # several updates a batch: each update's norm
                assert a["grad_norm_per_update"] == pytest.approx(b["grad_norm_per_update"], rel=1e-3), where
            assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6), where
            assert a["ppo_ratio_mean"] == pytest.approx(b["ppo_ratio_mean"], abs=1e-6), where
        assert weights.keys() == one_weights.keys()
        for key in weights:
            # Reduction order differs per world and layout (seen: 1.2e-5 after four updates at world 4).
            drift = adam_tolerance(1e-4, sum(m.get("optimizer_updates", 1) for m in one))
            assert (weights[key] - one_weights[key]).abs().max() <= drift, (world, key)


def test_every_member_of_every_prompt_is_rolled_out_once_at_every_world_size():
    prompts, group = 32, 32
    for world in (1, 2, 4, 8, 16, 32, 64, 128):
        owned: dict[tuple[int, int], int] = {}
        for rank in range(world):
            work = assignment.shared_prompt_work(rank, world, prompts, group)
            assert len(work.prompt_slots) == max(1, prompts // world)
            for slot in work.prompt_slots:
                for member in work.group_indices:
                    assert (slot, member) not in owned, (world, rank, slot, member)
                    owned[(slot, member)] = rank
        assert len(owned) == prompts * group, world
    # At 8 ranks, rank 3 serves prompts 3, 11, 19 and 27, whole groups, one prompt after another.
    cfg = config.from_dict(trainer_config(grpo={"prompts_per_step": 32, "group_size": 32}))
    rows = assignment.waves(cfg, 3, 8)
    assert [sorted({j for j, _ in wave}) for wave in rows] == [[3], [11], [19], [27]]
    assert all([g for _, g in wave] == list(range(32)) for wave in rows)


def test_the_5b_recipe_loads_on_one_and_two_nodes_and_a_world_that_fits_neither_way_is_refused(monkeypatch):
    monkeypatch.chdir(REPO)
    layers = ["config/config.yaml", "config/recipes/rl_5b_cps.yaml"]
    for nodes in (1, 2):
        assert config.load(layers, {"parallel": {"nodes": nodes}}).world_size == 8 * nodes
    with pytest.raises(ConfigError, match="world size 12 .* must divide or be a multiple of the prompts per wave 32"):
        config.load(layers, {"parallel": {"nodes": 1, "procs_per_node": 12}})
