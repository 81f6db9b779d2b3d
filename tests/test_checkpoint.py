import json

import pytest
import torch

from videogrpo.errors import VideoGRPOError
from videogrpo.grpo import checkpoint


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_round_trip_restores_weights_optimizer_rng_and_state(tmp_path):
    model, optimizer = model_and_optimizer(0)
    torch.manual_seed(123)
    path = checkpoint.save(tmp_path, 3, model, optimizer, {"step": 3}, rank=0, keep=2)
    expected_draw = torch.rand(3)
    other, other_opt = model_and_optimizer(1)
    state = checkpoint.load(path, other, other_opt, rank=0)
    assert state == {"step": 3, "parts": ["transformer"], "extra": []}
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], other_opt.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(torch.rand(3), expected_draw)


def test_only_complete_checkpoints_count_and_old_ones_are_pruned(tmp_path):
    model, optimizer = model_and_optimizer(0)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, model, optimizer, {"step": step}, rank=0, keep=2)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    (tmp_path / "step-00000009").mkdir()  # a crash before the marker
    assert checkpoint.latest_complete(tmp_path).name == "step-00000003"
    with pytest.raises(VideoGRPOError, match="not a complete checkpoint"):
        checkpoint.load(tmp_path / "step-00000009", model, optimizer, rank=0)


def test_each_folder_resume_skips_is_named_with_why(tmp_path):
    """A Ctrl-C at a checkpoint boundary leaves a step folder without its marker: resume skips it, and says so."""
    model, optimizer = model_and_optimizer(0)
    checkpoint.save(tmp_path, 1, model, optimizer, {"step": 1}, rank=0, keep=2)
    cut = checkpoint.save(tmp_path, 2, model, optimizer, {"step": 2}, rank=0, keep=2)
    (cut / checkpoint.MARKER).unlink()  # the save stopped before rank 0 wrote the marker
    (tmp_path / "step-3").mkdir()
    (tmp_path / "metrics.jsonl").write_text("")  # the tracker's file lives here too: not a checkpoint folder
    assert checkpoint.latest_complete(tmp_path).name == "step-00000001"
    assert checkpoint.ignored_folders(tmp_path) == [
        f"{cut}: incomplete (no COMPLETE marker: its save was cut short by an interruption, a crash or a full disk; "
        f"it holds dcp, rng, state.json), ignored; the next save of that step replaces it",
        f"{tmp_path / 'step-3'}: not a checkpoint folder name (step-<8 digits>), ignored",
    ]
    assert checkpoint.ignored_folders(tmp_path / "none") == []


@pytest.mark.parametrize("auto_resume", [True, False])
def test_a_training_that_starts_over_says_why_it_skipped_each_checkpoint(tmp_path, auto_resume):
    """The trainer's resume logs every skipped folder before it picks where to start."""
    from types import SimpleNamespace

    from videogrpo import config
    from videogrpo.grpo.trainer import Trainer

    model, optimizer = model_and_optimizer(0)
    (tmp_path / "step-00000002" / "dcp").mkdir(parents=True)  # Ctrl-C while the first checkpoint was written
    trainer = Trainer.__new__(Trainer)
    trainer.cfg = config.from_dict({"train": {"auto_resume": auto_resume}}, partial=True)
    trainer.paths = SimpleNamespace(checkpoints=tmp_path)
    logged = []
    trainer._log = logged.append
    assert trainer._resume() == 0
    assert logged == [
        f"{tmp_path / 'step-00000002'}: incomplete (no COMPLETE marker: its save was cut short by an interruption, "
        f"a crash or a full disk; it holds dcp), ignored; the next save of that step replaces it"
    ]
    if auto_resume:
        return
    checkpoint.save(tmp_path, 1, model, optimizer, {"step": 1}, rank=0, keep=2)
    logged.clear()
    assert trainer._resume() == 0
    assert logged[-1] == (
        f"train.auto_resume is false: the 1 complete checkpoint(s) in {tmp_path} (newest step-00000001) are not resumed"
    )


def test_non_finite_weights_are_never_saved(tmp_path):
    model, optimizer = model_and_optimizer(0)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(VideoGRPOError, match="non-finite weights; refusing"):
        checkpoint.save(tmp_path, 1, model, optimizer, {"step": 1}, rank=0, keep=2)
    assert checkpoint.latest_complete(tmp_path) is None


def test_weights_only_load(tmp_path):
    model, optimizer = model_and_optimizer(0)
    path = checkpoint.save(tmp_path, 1, model, optimizer, {"step": 1}, rank=0, keep=1)
    other, _ = model_and_optimizer(1)
    checkpoint.load(path, other, None, rank=0, restore_rng=False)
    assert torch.equal(model.weight, other.weight)
    assert json.loads((path / "state.json").read_text())["step"] == 1


GUARD = {"run_id": "tiny-0123456789ab", "inputs": {"model": "a" * 64, "dataset": "d" * 64}, "trainer_math": {}}


def test_a_guard_matches_only_the_same_run_inputs_and_math():
    assert checkpoint.resume_problems(GUARD, GUARD, allow_code_change=False) == []
    other = dict(GUARD, inputs=dict(GUARD["inputs"], model="b" * 64))
    assert checkpoint.resume_problems(GUARD, other, False) == [
        f"input model changed: trained on {'a' * 64}, now {'b' * 64}"
    ]


@pytest.mark.parametrize(
    "saved, problem",
    [
        (dict(GUARD, inputs={"model": "a" * 64}), f"it records no digest of input dataset (this run's: {'d' * 64})"),
        ({k: v for k, v in GUARD.items() if k != "inputs"}, "it records no digest of input dataset"),
        ({}, "it records no run identity (this is run 'tiny-0123456789ab')"),
    ],
    ids=["one-input", "no-inputs", "no-guard"],
)
def test_a_digest_the_checkpoint_lacks_is_a_refusal_naming_it(saved, problem):
    found = checkpoint.resume_problems(saved, GUARD, allow_code_change=True)
    assert any(problem in p for p in found), found


def test_a_digest_this_run_lacks_is_a_refusal_naming_it():
    current = dict(GUARD, inputs={"model": "a" * 64})
    assert checkpoint.resume_problems(GUARD, current, allow_code_change=True) == [
        f"it records input dataset ({'d' * 64}), of which this run has no digest"
    ]


def test_topologies_compare_every_key_either_side_records():
    topology = {"world_size": 128, "group_size": 32}
    assert checkpoint.topology_problems(topology, dict(topology)) == []
    assert checkpoint.topology_problems(topology, dict(topology, world_size=64)) == [
        "world_size 128 in the checkpoint, 64 in this run"
    ]
    assert checkpoint.topology_problems(topology, dict(topology, batch_size=1)) == [
        "batch_size recorded on one side only"
    ]
    assert checkpoint.topology_problems(None, topology) == [
        "the checkpoint records no topology (written by an older trainer)"
    ]


def test_two_experts_are_one_checkpoint_and_refused_by_another_model(tmp_path):
    """Both experts and both optimizers in one DCP save (one marker: complete only with both); loading it into
    one transformer, or one transformer's into two experts, names both sides."""
    high, high_opt = model_and_optimizer(0)
    low, low_opt = model_and_optimizer(1)
    path = checkpoint.save(tmp_path, 2, {"high": (high, high_opt), "low": (low, low_opt)}, None, {"step": 2}, 0, 2)
    parts = {name: model_and_optimizer(seed) for name, seed in (("high", 2), ("low", 3))}
    state = checkpoint.load(path, parts, None, rank=0)
    assert state["parts"] == ["high", "low"]
    for name, (model, optimizer) in (("high", (high, high_opt)), ("low", (low, low_opt))):
        restored, restored_opt = parts[name]
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters()))
        assert torch.equal(
            optimizer.state_dict()["state"][0]["exp_avg"], restored_opt.state_dict()["state"][0]["exp_avg"]
        )
    one, one_opt = model_and_optimizer(4)
    with pytest.raises(
        VideoGRPOError, match=r"holds the trainable parts \['high', 'low'\], this run trains \['transformer'\]"
    ):
        checkpoint.load(path, one, one_opt, rank=0)
    single = checkpoint.save(tmp_path / "one", 1, one, one_opt, {"step": 1}, 0, 1)
    with pytest.raises(
        VideoGRPOError, match=r"holds the trainable parts \['transformer'\], this run trains \['high', 'low'\]"
    ):
        checkpoint.load(single, parts, None, rank=0)
