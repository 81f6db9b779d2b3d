"""Trainer options, each checked by its effect in a world of one run in this process (tiny model, 2 updates).

Guidance, the KL term, per-prompt noise levels, waves, shared group noise, gradient checkpointing and
`resume_from` in both modes. Two-rank behaviour (sharding, reductions, resume after SIGKILL) is in
test_trainer.py.
"""

from __future__ import annotations

import re

import pytest
import torch

from harness import (
    metrics,
    model_with_scheduler,
    solo_config,
    tensors,
    train_in_process,
    trainer_in_process,
    weights,
)

BASE = dict(train={"max_steps": 2, "save_steps": 1, "keep_checkpoints": 3})


def options(**sections) -> dict:
    cfg = solo_config(**BASE)
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


@pytest.fixture(scope="module")
def baseline(tiny_model, dataset, tmp_path_factory):
    return train_in_process(options(), tmp_path_factory.mktemp("baseline"), tiny_model, dataset)


def strip_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


def test_gradient_checkpointing_recomputes_exactly(baseline, tiny_model, dataset, tmp_path):
    trainer = trainer_in_process(options(train={"gradient_checkpointing": True}), tmp_path, tiny_model, dataset)
    checkpointed = trainer.experts.policy._gradient_checkpointing_func
    calls = []
    trainer.experts.policy._gradient_checkpointing_func = lambda *a, **k: calls.append(1) or checkpointed(*a, **k)
    trainer.run()
    assert calls  # the blocks really ran under activation checkpointing
    out = tmp_path
    assert weights(out) == weights(baseline)
    # The recompute's FLOPs are the one thing checkpointing changes in the metrics (grpo/flops.py).
    checkpointed, plain = strip_times(metrics(out)), strip_times(metrics(baseline))
    for a, b in zip(checkpointed, plain):
        assert a.pop("model_flops_per_update") > b.pop("model_flops_per_update")
    assert checkpointed == plain


def test_guidance_above_one_changes_the_rollouts_and_replays_them_exactly(baseline, tiny_model, dataset, tmp_path):
    out = train_in_process(options(grpo={"guidance_scale": 3.0}), tmp_path, tiny_model, dataset)
    guided, plain = metrics(out), metrics(baseline)
    assert [m["reward_mean"] for m in guided] != [m["reward_mean"] for m in plain]
    assert all(m["ppo_ratio_mean"] == 1.0 and m["ppo_ratio_abs_max"] == 0.0 for m in guided)  # replay guides too


def test_the_kl_term_is_zero_at_the_reference_then_pulls_back(baseline, tiny_model, dataset, tmp_path):
    out = train_in_process(options(grpo={"kl_coeff": 0.5}), tmp_path, tiny_model, dataset)
    first, second = metrics(out)
    assert first["kl_loss"] == 0.0  # the policy still is the reference
    assert second["kl_loss"] > 0.0
    assert weights(out) != weights(baseline)


def prepared_chunk(cfg: dict, out, tiny_model, dataset, batch: int = 0):
    trainer = trainer_in_process(cfg, out, tiny_model, dataset)
    try:
        [chunk] = trainer.prepare(batch).chunks
        return trainer, chunk
    finally:
        trainer.scorer.close()


def test_shared_group_noise_starts_every_member_from_one_noise(tiny_model, dataset, tmp_path):
    _, shared = prepared_chunk(options(), tmp_path / "shared", tiny_model, dataset)
    _, own = prepared_chunk(options(grpo={"share_group_noise": False}), tmp_path / "own", tiny_model, dataset)
    x0_shared, x0_own = shared.trajectory.latents[:, 0], own.trajectory.latents[:, 0]
    assert all(torch.equal(x0_shared[0], x) for x in x0_shared[1:])
    assert not any(torch.equal(x0_own[0], x) for x in x0_own[1:])
    assert not torch.equal(shared.trajectory.latents[0, -1], shared.trajectory.latents[1, -1])  # step noise differs


def test_eta_range_draws_one_noise_level_per_prompt(tiny_model, dataset, tmp_path):
    cfg = options(grpo={"eta_range": [0.1, 0.9]})
    etas = [prepared_chunk(cfg, tmp_path / str(b), tiny_model, dataset, b)[1].trajectory.etas for b in (0, 1)]
    for batch in etas:
        assert len(set(batch.tolist())) == 1 and 0.1 <= batch[0] <= 0.9  # one prompt per batch here
    assert etas[0][0] != etas[1][0] and etas[0][0] != 0.7


def test_waves_roll_out_and_train_what_one_batch_of_whole_groups_does(tiny_model, dataset, tmp_path):
    """Two waves of one prompt each against the same two prompts as one chunk (replica mode)."""
    two = options(grpo={"prompts_per_step": 2, "prompts_per_wave": 1})
    whole = options(grpo={"prompts_per_step": 2, "shared_prompts": False}, train={"batch_size": 2})
    trainer = trainer_in_process(two, tmp_path / "probe", tiny_model, dataset)
    trainer.scorer.close()
    assert [[j for j, _ in rows] for rows in trainer.waves] == [[0] * 4, [1] * 4]
    a = train_in_process(two, tmp_path / "waves", tiny_model, dataset)
    b = train_in_process(whole, tmp_path / "whole", tiny_model, dataset)
    for x, y in zip(metrics(a), metrics(b)):
        assert x["reward_mean"] == pytest.approx(y["reward_mean"], abs=1e-4)
        assert x["advantage_mean"] == pytest.approx(y["advantage_mean"], abs=1e-5)
    ta, tb = tensors(a), tensors(b)
    for key in ta:  # batch composition changes float rounding only
        assert (ta[key] - tb[key]).abs().max() <= 1e-5, key


def test_resume_from_with_full_state_continues_the_run_bit_identically(baseline, tiny_model, dataset, tmp_path):
    source = baseline / "checkpoints/step-00000001"
    out = train_in_process(
        options(train={"resume_from": str(source), "reset_dataloader": False}), tmp_path, tiny_model, dataset
    )
    assert weights(out) == weights(baseline)
    assert strip_times(metrics(out)) == strip_times(metrics(baseline)[1:])


def test_resume_from_weights_only_restarts_optimizer_schedule_and_data(baseline, tiny_model, dataset, tmp_path):
    source = str(baseline / "checkpoints/step-00000001")
    starts, trainers = {}, {}
    for reset in (True, False):
        trainer = trainer_in_process(
            options(train={"resume_from": source, "reset_dataloader": reset}),
            tmp_path / str(reset),
            tiny_model,
            dataset,
        )
        trainer.scorer.close()
        starts[reset], trainers[reset] = trainer._resume(), trainer
    assert starts == {True: 0, False: 1}  # weights only: from the first batch again
    assert not trainers[True].experts.experts[0].optimizer.state and trainers[False].experts.experts[0].optimizer.state
    fresh, loaded = trainers[True].experts.policy.state_dict(), trainers[False].experts.policy.state_dict()
    assert all(torch.equal(fresh[k], loaded[k]) for k in fresh)  # the same weights either way
    initial = trainer_in_process(options(), tmp_path / "initial", tiny_model, dataset)
    initial.scorer.close()
    assert not all(torch.equal(fresh[k], v) for k, v in initial.experts.policy.state_dict().items())


INPUTS = {"model": "a" * 64, "dataset": "d" * 64, "training_ids": "e" * 64}


@pytest.fixture(scope="module")
def guarded(tiny_model, dataset, tmp_path_factory):
    """A finished one-update run whose checkpoint records its inputs and the trainer's math."""
    out = tmp_path_factory.mktemp("guarded")
    trainer_in_process(options(train={"max_steps": 1}), out, tiny_model, dataset, INPUTS).run()
    return out


def resume_in(out, tiny_model, dataset, inputs=INPUTS, **train):
    trainer = trainer_in_process(options(train={"max_steps": 1, **train}), out, tiny_model, dataset, inputs)
    trainer.scorer.close()
    return trainer._resume()


def test_auto_resume_continues_under_the_same_inputs_and_math(guarded, tiny_model, dataset):
    assert resume_in(guarded, tiny_model, dataset) == 1  # past the last action: nothing left to train


def test_auto_resume_refuses_other_inputs_naming_both_digests(guarded, tiny_model, dataset):
    from videogrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"input model changed: trained on a{64}, now b{64}.*remove .*checkpoints"):
        resume_in(guarded, tiny_model, dataset, dict(INPUTS, model="b" * 64))


def test_a_change_of_the_trainer_math_needs_the_users_word(guarded, tiny_model, dataset, monkeypatch):
    from videogrpo.errors import ConfigError
    from videogrpo.grpo import checkpoint

    real = checkpoint.trainer_math()
    assert "grpo/loss.py" in real and "grpo/tracking.py" not in real  # logging is not math
    rewards = {"rule.py", "scorer_process.py", "evalkit.py", "judge.py", "judge_protocol.py"}
    assert {f"rewards/{name}" for name in rewards} <= set(real)  # every file that computes a training reward
    monkeypatch.setattr(checkpoint, "trainer_math", lambda: dict(real, **{"grpo/loss.py": "0" * 64}))
    with pytest.raises(
        ConfigError,
        match=r"trainer's math changed since it was written \(grpo/loss.py\); set "
        r"train.resume_across_code_changes: true",
    ):
        resume_in(guarded, tiny_model, dataset)
    assert resume_in(guarded, tiny_model, dataset, resume_across_code_changes=True) == 1


@pytest.mark.parametrize(
    "inputs, named",
    [
        ({k: v for k, v in INPUTS.items() if k != "training_ids"}, "of which this run has no digest"),
        (dict(INPUTS, judge_model="f" * 64), "it records no digest of input judge_model"),
    ],
    ids=["missing-here", "missing-in-the-checkpoint"],
)
def test_auto_resume_refuses_an_input_digest_one_side_lacks(guarded, tiny_model, dataset, inputs, named):
    """What cannot be compared cannot be shown the same: a digest on one side only is a refusal naming it."""
    from videogrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"not resuming this checkpoint: .*{named}"):
        resume_in(guarded, tiny_model, dataset, inputs)


def stateful_resume(source, out, tiny_model, dataset, world_size=1, **sections):
    cfg = options(train={"resume_from": str(source), "reset_dataloader": False})
    for section, values in sections.items():
        cfg[section].update(values)
    trainer = trainer_in_process(cfg, out, tiny_model, dataset, world_size=world_size)
    trainer.scorer.close()
    return trainer._resume()


@pytest.mark.parametrize(
    "change, world_size, named",
    [
        ({"grpo": {"group_size": 2}}, 1, "group_size 4 in the checkpoint, 2 in this run"),
        ({}, 2, "world_size 1 in the checkpoint, 2 in this run"),
        ({"grpo": {"shared_prompts": False}}, 1, "shared_prompts True in the checkpoint, False in this run"),
        ({"data": {"shuffle_seed": 7}}, 1, "training_order_sha256 '[0-9a-f]{64}' in the checkpoint"),
    ],
    ids=["group-size", "world-size", "prompt-layout", "training-order"],
)
def test_a_stateful_resume_from_refuses_another_topology_printing_both(
    baseline, tiny_model, dataset, tmp_path, change, world_size, named
):
    from videogrpo.errors import ConfigError

    source = baseline / "checkpoints/step-00000001"
    with pytest.raises(ConfigError) as refused:
        stateful_resume(source, tmp_path, tiny_model, dataset, world_size, **change)
    message = str(refused.value)
    assert re.search(named, message), message
    assert re.search(r'Checkpoint: \{.*"world_size": 1.*\}; this run: \{.*"world_size": ' + str(world_size), message)
    assert "reset_dataloader: true to take its weights only" in message
    # The same change with a weights-only start is fine: nothing of the data position is carried over.
    trainer = trainer_in_process(
        options(train={"resume_from": str(source), "reset_dataloader": True}, **change),
        tmp_path / "w",
        tiny_model,
        dataset,
    )
    trainer.scorer.close()
    assert trainer._resume() == 0


def test_a_stateful_resume_from_refuses_a_checkpoint_without_a_topology(baseline, tiny_model, dataset, tmp_path):
    import json
    import shutil

    from videogrpo.errors import ConfigError

    source = tmp_path / "old"
    shutil.copytree(baseline / "checkpoints/step-00000001", source)
    state = json.loads((source / "state.json").read_text())
    del state["topology"]
    (source / "state.json").write_text(json.dumps(state))
    with pytest.raises(ConfigError, match=r"records no topology.*Checkpoint: null; this run: \{"):
        stateful_resume(source, tmp_path / "run", tiny_model, dataset)


def test_a_stateful_resume_from_refuses_a_position_the_replay_plan_does_not_have(
    baseline, tiny_model, dataset, tmp_path
):
    from videogrpo.errors import ConfigError

    source = baseline / "checkpoints/step-00000002"
    with pytest.raises(
        ConfigError, match=r"written after update 2 at batch 1, where this run's replay plan has no action"
    ):
        stateful_resume(source, tmp_path, tiny_model, dataset, train={"max_steps": 1})


class CountingMemory:
    """Stands in for CUDA's peak-memory counters (grpo/peak_memory.py): records when it is reset, when a phase is
    entered and when it is read; a phase's peak reads 100 x resets + 1 (rollout) or + 2 (replay)."""

    def __init__(self, events: list):
        self.events, self.resets, self.entered = events, 0, set()

    def reset(self) -> None:
        self.resets += 1
        self.entered = set()
        self.events.append("reset")

    def enter(self, phase: str) -> None:
        self.entered.add(phase)
        self.events.append(f"enter {phase}")

    def phase_peaks(self) -> dict[str, int]:
        self.events.append("phase peaks")
        return {p: 100 * self.resets + (1 if p == "rollout" else 2) for p in self.entered}

    def peak(self) -> int:
        self.events.append("peak")
        return 100 * self.resets + 7


def test_peak_memory_is_reset_where_each_update_period_starts(tiny_model, dataset, tmp_path):
    """Delayed replay: the first update's period holds a prefill; each logged peak covers exactly its period."""
    cfg = options(grpo={"delayed_replay": True}, train={"max_steps": 3, "save_steps": 1000})
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    events: list = []
    trainer.memory = CountingMemory(events)
    prepare = trainer.prepare
    trainer.prepare = lambda batch: events.append(f"rollout {batch}") or prepare(batch)
    trainer.run()
    read = ("enter replay", "phase peaks", "peak")
    assert events == [
        *("reset", "rollout 0", "enter rollout", "rollout 1", "enter rollout", *read),  # prefill, the first update
        *("reset", "rollout 2", "enter rollout", *read),
        *("reset", *read),  # the flush at max_steps replays batch 2 and skips batch 3
    ]
    lines = metrics(tmp_path)
    assert [m["peak_memory_bytes"] for m in lines] == [107, 207, 307]
    # Each phase's own peak; the last period rolls nothing out.
    assert [m["peak_memory_rollout_bytes"] for m in lines] == [101, 201, 0]
    assert [m["peak_memory_replay_bytes"] for m in lines] == [102, 202, 302]


def shifted_model(tiny_model, tmp_path, shift):
    return model_with_scheduler(
        tiny_model, tmp_path / "shifted", {"_class_name": "UniPCMultistepScheduler", "flow_shift": shift, "shift": 1.0}
    )


@pytest.mark.parametrize("override", [None, 2.0])
def test_the_flow_shift_is_the_models_unless_grpo_shift_overrides_it(tiny_model, dataset, tmp_path, override):
    from videogrpo.grpo.samplers import sigma_schedule

    model = shifted_model(tiny_model, tmp_path, 3.0)
    trainer = trainer_in_process(options(grpo={"shift": override}), tmp_path, model, dataset)
    trainer.scorer.close()
    expected = 3.0 if override is None else override
    assert trainer.shift == expected
    assert torch.equal(trainer.sigmas, sigma_schedule(8, expected))
    where = f"from {model}/scheduler/scheduler_config.json: flow_shift" if override is None else "grpo.shift override"
    assert trainer.shift_source == where


@pytest.mark.parametrize("fail_on_error", [False, True])
@pytest.mark.parametrize("where", ["caught by the EvalKit", "escaping the EvalKit"])
def test_evaluator_errors_are_counted_or_stop_the_run(tiny_model, dataset, tmp_path, fail_on_error, where):
    """An evaluator error the EvalKit reports (scored 0) and an exception escaping it (scored
    evalkit.unsupported_score) both count in reward_errors, or both stop the run naming the task."""
    import shutil
    from pathlib import Path

    from videogrpo.errors import VideoGRPOError
    from videogrpo.provenance.digest import evalkit_source_digest

    cfg = options()
    kit = tmp_path / "kit"
    shutil.copytree(Path(cfg["evalkit"]["path"]), kit)
    entry = kit / "run_evaluation.py"
    head = "    try:\n        evaluator = TASK_EVALUATOR_MAP[task_name]"
    raising = "    raise KeyError('meta_px')\n"
    inside = head.replace("    try:\n", "    try:\n    " + raising)
    broken = raising + head if where == "escaping the EvalKit" else inside
    entry.write_text(entry.read_text().replace(head, broken))
    cfg["evalkit"].update(
        path=str(kit), digest=evalkit_source_digest(kit), fail_on_error=fail_on_error, unsupported_score=0.25
    )
    if fail_on_error:
        with pytest.raises(VideoGRPOError, match=r"evaluator of task .* failed on .*KeyError: 'meta_px'"):
            train_in_process(cfg, tmp_path / "run", tiny_model, dataset)
        return
    rows = metrics(train_in_process(cfg, tmp_path / "run", tiny_model, dataset))
    scored = 0.25 if where == "escaping the EvalKit" else 0.0
    assert [r["reward_errors"] for r in rows] == [4, 4] and all(r["reward_mean"] == scored for r in rows)


@pytest.mark.parametrize("fail_on_error", [False, True])
def test_a_ground_truth_video_missing_at_scoring_time_is_counted_or_stops_the_run(
    tiny_model, dataset, tmp_path, fail_on_error
):
    """The stand-in EvalKit, as the public one for a task that does not read it, would score a sample whose
    ground_truth.mp4 is gone without a word: the training reward counts it in reward_errors at
    evalkit.unsupported_score, or stops the run naming the file."""
    import shutil
    from pathlib import Path

    from videogrpo.errors import VideoGRPOError

    copy = Path(shutil.copytree(dataset, tmp_path / "dataset"))
    gone = sorted(copy.glob("raw/*/*/video/ground_truth.mp4"))
    assert gone
    for path in gone:
        path.unlink()
    cfg = options()
    cfg["evalkit"].update(fail_on_error=fail_on_error, unsupported_score=0.25)
    if fail_on_error:
        with pytest.raises(VideoGRPOError, match=r"cannot be scored: missing at scoring time: .*/ground_truth\.mp4"):
            train_in_process(cfg, tmp_path / "run", tiny_model, copy)
        return
    rows = metrics(train_in_process(cfg, tmp_path / "run", tiny_model, copy))
    assert [r["reward_errors"] for r in rows] == [4, 4] and all(r["reward_mean"] == 0.25 for r in rows)
