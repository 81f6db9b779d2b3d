"""Several optimizer updates per rollout batch (grpo.updates_per_batch, grpo.update_passes, grpo.update_order;
docs/options.md#several-updates-per-batch): the sets each update trains, the forwards each rank runs for them, the
gradient each update takes, and a resume after a crash between two updates of one batch.

The 1-, 2- and 4-rank agreement of several updates per batch (padding forwards included) is
tests/test_prompts_per_rank.py's delayed mode.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest
import torch

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.grpo import assignment, minibatches

from harness import launch, metrics, solo_config, train, train_in_process, trainer_config, without_times


def grpo_config(**grpo):
    return config.from_dict(trainer_config(grpo={"prompts_per_step": 4, "group_size": 8, **grpo}))


def test_a_pass_splits_every_row_of_the_batch_into_equal_sets_keyed_by_batch_and_pass():
    cfg = grpo_config(updates_per_batch=4, update_passes=2)
    rows = {(j, m) for j in range(4) for m in range(8)}
    sets = minibatches.update_sets(cfg.grpo, 42, 7)
    assert [p for p, _ in sets] == [0] * 4 + [1] * 4
    for p in (0, 1):
        mine = [s for q, s in sets if q == p]
        assert [len(s) for s in mine] == [8] * 4 and set().union(*mine) == rows  # a partition of the batch
        assert len({j for j, _ in mine[0]}) > 1  # prompts mixed
    assert sets[:4] != sets[4:]  # each pass its own order
    assert minibatches.update_sets(cfg.grpo, 42, 7) == sets  # keyed: the same on every rank and every resume
    assert minibatches.update_sets(cfg.grpo, 42, 8) != sets
    by_member = minibatches.update_sets(grpo_config(updates_per_batch=4, update_order="by_member").grpo, 42, 7)
    assert [sorted({m for _, m in s}) for _, s in by_member] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all({j for j, _ in s} == {0, 1, 2, 3} for _, s in by_member)  # every prompt in every update
    assert minibatches.update_sets(grpo_config(update_passes=3).grpo, 42, 7) == [(0, None), (1, None), (2, None)]


@pytest.mark.parametrize("layout", ["fsdp", "replicate"])
def test_each_set_is_replayed_once_over_the_ranks_and_sharded_ranks_run_as_many_forwards(layout):
    """Every row of a set is in exactly one data replica's forwards (TP peers replay the same ones), at every world
    size; under FSDP each rank pads to the most forwards any rank runs, with forwards of weight 0; replicate pads
    nothing."""
    worlds = [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1)] + ([(8, 2)] if layout == "fsdp" else [])
    for world, tp in worlds:
        grpo = {"updates_per_batch": 4, "sample_batch_size": 1}
        if tp > 1:  # tensor parallel takes whole groups a data replica (no shared-prompt waves)
            grpo["shared_prompts"] = False
        cfg = config.from_dict(
            trainer_config(
                grpo={"prompts_per_step": 4, "group_size": 8, **grpo},
                train={"batch_size": 4 * tp // world if tp > 1 else 1},
                parallel={"procs_per_node": world, "data_parallel": layout, "tensor_parallel": tp},
            )
        )
        padded = 0
        for _, rows in minibatches.update_sets(cfg.grpo, 42, 3):
            seen, counts = Counter(), []
            for rank in range(world):
                waves = assignment.waves(cfg, rank, world)
                forwards = minibatches.rank_forwards(cfg, waves, world, rows)
                counts.append(len(forwards))
                if rank % tp == 0:  # the first rank of each TP pair: its peer replays the same rows
                    seen.update(waves[f.chunk][i] for f in forwards if f.weight for i in f.at)
                padded += sum(f.weight == 0 for f in forwards)
                assert all(len(f.at) == 1 for f in forwards)  # sample_batch_size 1: one member at a time
            assert seen == Counter(rows), (world, tp, layout)
            if layout == "fsdp":
                assert len(set(counts)) == 1, (world, tp, counts)
        assert (padded > 0) == (layout == "fsdp" and world // tp > 1), (world, tp, padded)


def test_the_sets_must_divide_the_batch_and_dropping_takes_shuffled_sets_and_grpo():
    with pytest.raises(ConfigError, match=r"grpo.updates_per_batch = 5: must divide the batch's 32 rollouts"):
        grpo_config(updates_per_batch=5)
    with pytest.raises(ConfigError, match=r"grpo.updates_per_batch = 16 with grpo.update_order = 'by_member'"):
        grpo_config(updates_per_batch=16, update_order="by_member")
    with pytest.raises(ConfigError, match=r"grpo.update_passes = 0: must be > 0"):
        grpo_config(update_passes=0)
    with pytest.raises(ConfigError, match=r"grpo.update_order = 'random'"):
        grpo_config(update_order="random")
    with pytest.raises(ConfigError, match=r"grpo.drop_zero_advantage and grpo.skip_zero_variance_groups"):
        grpo_config(drop_zero_advantage=True, skip_zero_variance_groups=True)
    with pytest.raises(ConfigError, match=r"grpo.drop_zero_advantage with grpo.update_order = 'by_member'"):
        grpo_config(drop_zero_advantage=True, updates_per_batch=2, update_order="by_member")
    with pytest.raises(ConfigError, match=r"grpo.drop_zero_advantage = True with grpo.algorithm = 'nft'"):
        grpo_config(drop_zero_advantage=True, algorithm="nft", delayed_replay=False)


def record_gradients(monkeypatch) -> list[list[torch.Tensor]]:
    """Every optimizer update's gradient (all trained parameters, flattened), one list per run: append a list
    before each run."""
    from videogrpo.grpo.experts import Experts

    runs, step = [], Experts.step

    def recording(self, lr, max_norm):
        runs[-1].append(torch.cat([p.grad.detach().flatten().clone() for e in self.experts for p in e.params]))
        return step(self, lr, max_norm)

    monkeypatch.setattr(Experts, "step", recording)
    return runs


def test_each_update_takes_the_mean_gradient_of_its_rows_and_a_second_pass_replays_the_same(
    monkeypatch, tiny_model, dataset, tmp_path
):
    """At a learning rate too small to move a float32 weight (AdamW's first step is lr x sign: 1e-48 rounds to 0)
    every update sees the rollout's weights, so the two sets' gradients average to the one update's of the whole
    batch (each row counted once, with its set's share of the mean), and a second pass repeats the first bit for
    bit."""
    base = solo_config(train={"lr": 1e-48, "max_steps": 1, "warmup_steps": 0})
    recorded, runs = record_gradients(monkeypatch), {}
    for name, grpo in {
        "one": {},
        "halves": {"updates_per_batch": 2},
        "two passes": {"update_passes": 2},
    }.items():
        recorded.append([])
        out = train_in_process(solo_config(train=base["train"], grpo=grpo), tmp_path / name, tiny_model, dataset)
        runs[name] = recorded[-1], metrics(out)
    [whole], [one] = runs["one"]
    halves, [split] = runs["halves"]
    assert len(halves) == 2 and not torch.equal(halves[0], halves[1])
    assert torch.allclose((halves[0] + halves[1]) / 2, whole, rtol=1e-5, atol=1e-9)
    passes, [twice] = runs["two passes"]
    assert len(passes) == 2 and torch.equal(passes[0], whole) and torch.equal(passes[1], whole)
    assert "optimizer_updates" not in one and split["optimizer_updates"] == twice["optimizer_updates"] == 2
    assert split["grad_norm_per_update"] == pytest.approx([float(h.norm()) for h in halves], rel=1e-5)
    assert split["trained_timesteps"] == one["trained_timesteps"]
    assert twice["policy_loss"] == pytest.approx(one["policy_loss"], abs=1e-9)  # a mean over both passes' terms


def test_a_crash_between_two_updates_of_a_batch_resumes_to_the_uninterrupted_weights(
    monkeypatch, tiny_model, dataset, tmp_path
):
    """Checkpoints follow a batch's last update, so a rank killed after the first update of batch 2 resumes from
    batch 1's checkpoint and replays batch 2 whole: the weights and metrics of the run that never stopped."""
    cfg = solo_config(grpo={"updates_per_batch": 2}, train={"max_steps": 2, "save_steps": 1})
    assert train(cfg, tmp_path / "whole", tiny_model, dataset)
    monkeypatch.setenv("CRASH_AFTER_UPDATE", "3")  # batch 1: updates 1 and 2 (checkpointed), batch 2: 3, 4
    proc = launch(cfg, tmp_path / "crashed", tiny_model, dataset, worker="crash_worker")
    assert proc.wait(timeout=600) != 0
    log = (tmp_path / "crashed/log.txt").read_text()
    assert f"exitcode  : -{int(signal.SIGKILL)}" in log, log[-3000:]
    assert [m["step"] for m in metrics_lines(tmp_path / "crashed")] == [1]
    monkeypatch.delenv("CRASH_AFTER_UPDATE")
    assert train(cfg, tmp_path / "crashed", tiny_model, dataset)
    assert "resumed from" in (tmp_path / "crashed/log.txt").read_text()
    whole, resumed = (tmp_path / "whole/final/transformer"), (tmp_path / "crashed/final/transformer")
    assert (whole / "diffusion_pytorch_model.safetensors").read_bytes() == (
        resumed / "diffusion_pytorch_model.safetensors"
    ).read_bytes()
    assert without_times(metrics(tmp_path / "crashed")) == without_times(metrics(tmp_path / "whole"))


def metrics_lines(out) -> list[dict]:
    """The metrics the checkpoints' log holds so far (the run's metrics.jsonl is written at its end)."""
    import json

    path = out / "checkpoints/metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
