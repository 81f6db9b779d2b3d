"""SFT initialisation from the reference's DCP checkpoints and this project's own (videogrpo.grpo.sft_init).

Checkpoints are written with torch.distributed.checkpoint in each layout (tests/sft_ckpt.py) from the tiny I2V
expert, then read into freshly built experts of other seeds and compared tensor by tensor, exactly. One case
runs 2 gloo processes: FSDP2- and TP2-sharded experts (tests/sft_init_worker.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sft_ckpt import cloned, shifted, tiny_expert, write_own_experts, write_reference, write_reference_root

from videogrpo.errors import ConfigError
from videogrpo.grpo import checkpoint, sft_init

REPO = Path(__file__).parents[1]


def assert_holds(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


@pytest.fixture(scope="module")
def sft():
    """Training state and a distinct EMA copy of both experts."""
    train = {"transformer": cloned(tiny_expert(1)), "transformer_2": cloned(tiny_expert(2))}
    ema = {key: shifted(sd, 0.5) for key, sd in train.items()}
    return train, ema


def fresh_experts() -> dict[str, torch.nn.Module]:
    return {"high": tiny_expert(101), "low": tiny_expert(102)}


def test_per_expert_folders_give_each_expert_its_ema_copy(tmp_path, sft):
    train, ema = sft
    path = write_reference(tmp_path / "checkpoint-700", train, ema)
    experts, lines = fresh_experts(), []
    report = sft_init.load_initial_weights(path, experts, log=lines.append)
    assert_holds(experts["high"], ema["transformer"])
    assert_holds(experts["low"], ema["transformer_2"])
    assert report.layout == "reference_experts"
    n = len(train["transformer"])
    assert {
        name: (e.folder.name, e.source, e.loaded, e.from_training, e.dropped) for name, e in report.experts.items()
    } == {
        "high": ("high", "ema", n, 0, ()),
        "low": ("low", "ema", n, 0, ()),
    }
    assert lines == []  # counters, RNG, optimizer and dataloader files are not the experts' and go unmentioned
    assert "high: ema weights from" in report.summary() and f"({n} float32 tensors; 0 dropped)" in report.summary()


def test_without_ema_the_training_state_is_taken(tmp_path, sft):
    train, _ = sft
    path = write_reference(tmp_path / "ckpt", train)
    experts = fresh_experts()
    report = sft_init.load_initial_weights(path, experts, log=print)
    assert_holds(experts["high"], train["transformer"])
    assert_holds(experts["low"], train["transformer_2"])
    assert {e.source for e in report.experts.values()} == {"training"}


def test_ema_is_chosen_per_expert(tmp_path, sft):
    train, ema = sft
    path = write_reference(tmp_path / "ckpt", train, {"transformer_2": ema["transformer_2"]})
    experts = fresh_experts()
    report = sft_init.load_initial_weights(path, experts, log=print)
    assert_holds(experts["high"], train["transformer"])
    assert_holds(experts["low"], ema["transformer_2"])
    assert (report.experts["high"].source, report.experts["low"].source) == ("training", "ema")


def test_a_tensor_the_ema_lacks_comes_from_the_training_state(tmp_path, sft):
    train, ema = sft
    frozen = "blocks.1.ffn.net.2.bias"  # the reference's EMA tracks only parameters that require grad
    partial = {k: v for k, v in ema["transformer"].items() if k != frozen}
    path = write_reference(tmp_path / "ckpt", {"transformer": train["transformer"]}, {"transformer": partial})
    model = tiny_expert(101)
    report = sft_init.load_initial_weights(path, {"high": model}, log=print)
    assert_holds(model, {**partial, frozen: train["transformer"][frozen]})
    assert (report.experts["high"].source, report.experts["high"].from_training) == ("ema", 1)


def test_a_bfloat16_checkpoint_loads_cast_into_a_float32_model(tmp_path, sft):
    train, _ = sft
    half = {k: v.bfloat16() for k, v in train["transformer"].items()}
    path = write_reference(tmp_path / "ckpt", {"transformer": half})
    model = tiny_expert(101)
    report = sft_init.load_initial_weights(path, {"high": model}, log=print)
    assert_holds(model, {k: v.float() for k, v in half.items()})
    assert report.experts["high"].dtypes == ("bfloat16",)


def test_legacy_root_serves_each_expert_from_its_own_key(tmp_path, sft):
    train, ema = sft
    path = write_reference_root(tmp_path / "legacy", train, ema)
    experts = fresh_experts()
    report = sft_init.load_initial_weights(path, experts, log=print)
    assert_holds(experts["high"], ema["transformer"])
    assert_holds(experts["low"], ema["transformer_2"])
    assert report.layout == "reference_root" and {e.folder for e in report.experts.values()} == {path}


def test_legacy_root_of_one_transformer_is_refused_for_two_experts(tmp_path, sft):
    train, _ = sft
    path = write_reference_root(tmp_path / "legacy", {"transformer": train["transformer"]})
    experts = fresh_experts()
    before = cloned(experts["high"])
    with pytest.raises(ConfigError) as err:
        sft_init.load_initial_weights(path, experts, log=print)
    message = str(err.value)
    assert f"{path}/.metadata holds no weights of expert 'low'" in message
    assert "ema.shadow.transformer_2.* or train_state.transformer_2.*" in message
    assert "train_state.transformer" in message  # what it does hold
    assert_holds(experts["high"], before)  # checked before any expert changes


def test_the_one_transformer_model_reads_the_references_high_folder(tmp_path, sft):
    train, ema = sft
    path = write_reference(
        tmp_path / "ckpt", {"transformer": train["transformer"]}, {"transformer": ema["transformer"]}
    )
    model = tiny_expert(101)
    report = sft_init.load_initial_weights(path, {"transformer": model}, log=print)
    assert_holds(model, ema["transformer"])
    assert report.experts["transformer"].folder == path / "high"


def test_this_projects_checkpoint_gives_its_weights_and_ignores_its_optimizer(tmp_path):
    written = tiny_expert(5)
    optimizer = torch.optim.AdamW(written.parameters(), lr=1e-3)
    written(**tiny_inputs()).sample.square().mean().backward()
    optimizer.step()
    path = checkpoint.save(tmp_path / "checkpoints", 4, written, optimizer, {"update": 4}, rank=0, keep=1)
    model = tiny_expert(101)
    report = sft_init.load_initial_weights(path, {"transformer": model}, log=print)
    assert_holds(model, cloned(written))
    assert (report.layout, report.experts["transformer"].source, report.experts["transformer"].dropped) == (
        "videogrpo",
        "training",
        (),
    )


def test_this_projects_two_expert_checkpoint(tmp_path, sft):
    train, _ = sft
    path = write_own_experts(tmp_path / "step-00000001", {"high": train["transformer"], "low": train["transformer_2"]})
    experts = fresh_experts()
    sft_init.load_initial_weights(path, experts, log=print)
    assert_holds(experts["high"], train["transformer"])
    assert_holds(experts["low"], train["transformer_2"])
    with pytest.raises(ConfigError, match=r"holds no weights of expert 'transformer': looked for model\.\*"):
        sft_init.load_initial_weights(path, {"transformer": tiny_expert(0)}, log=print)


def test_an_incomplete_checkpoint_of_this_project_is_refused(tmp_path, sft):
    train, _ = sft
    path = write_own_experts(tmp_path / "step-00000001", {"high": train["transformer"], "low": train["transformer_2"]})
    (path / "COMPLETE").unlink()
    with pytest.raises(ConfigError, match="without its COMPLETE marker"):
        sft_init.load_initial_weights(path, fresh_experts(), log=print)


def test_an_unknown_tensor_is_warned_about_and_dropped(tmp_path, sft):
    train, ema = sft
    extra = "blocks.9.attn1.to_q.weight"
    high = {**ema["transformer"], extra: torch.ones(3)}
    path = write_reference(tmp_path / "ckpt", {"transformer": train["transformer"]}, {"transformer": high})
    model, lines = tiny_expert(101), []
    report = sft_init.load_initial_weights(path, {"high": model}, log=lines.append)
    assert_holds(model, ema["transformer"])
    assert report.experts["high"].dropped == (extra,)
    assert lines == [
        f"warning: {path / 'high'}: 1 checkpoint tensors of expert 'high' have no counterpart in the model and are "
        f"dropped: {extra}"
    ]


def test_a_shape_mismatch_names_the_file_the_key_and_both_shapes(tmp_path):
    other = cloned(tiny_expert(1, ffn_dim=64))
    path = write_reference(tmp_path / "ckpt", {"transformer": other, "transformer_2": other})
    experts = fresh_experts()
    before = {name: cloned(m) for name, m in experts.items()}
    with pytest.raises(ConfigError) as err:
        sft_init.load_initial_weights(path, experts, log=print)
    message = str(err.value)
    assert message.startswith(
        f"{path}/high/.metadata: train_state.transformer.blocks.0.ffn.net.0.proj.weight has shape (64, 48) in the "
        "checkpoint but (96, 48) in expert 'high' (and 5 more mismatches)"
    )
    assert "set model.path to the model it was trained from" in message
    for name, model in experts.items():
        assert_holds(model, before[name])


def test_a_missing_expert_folder_is_named(tmp_path, sft):
    train, ema = sft
    path = write_reference(tmp_path / "ckpt", {"transformer": train["transformer"]}, ema)
    with pytest.raises(ConfigError) as err:
        sft_init.load_initial_weights(path, fresh_experts(), log=print)
    assert f"expert 'low' needs {path}/low/.metadata" in str(err.value)
    assert "holds only high/" in str(err.value)
    model = tiny_expert(102)  # train.experts: high loads only what the checkpoint has
    sft_init.load_initial_weights(path, {"high": model}, log=print)
    assert_holds(model, ema["transformer"])


def test_a_module_tensor_the_checkpoint_lacks_is_an_error(tmp_path, sft):
    train, _ = sft
    partial = {k: v for k, v in train["transformer"].items() if k != "proj_out.weight"}
    path = write_reference(tmp_path / "ckpt", {"transformer": partial})
    lacks = r"lacks 1 of the 69 tensors of expert 'high' \(proj_out\.weight; looked under train_state\.transformer\.\)"
    with pytest.raises(ConfigError, match=lacks):
        sft_init.load_initial_weights(path, {"high": tiny_expert(0)}, log=print)


def test_a_path_of_no_layout_lists_what_was_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as err:
        sft_init.load_initial_weights(tmp_path / "empty", fresh_experts(), log=print)
    message = str(err.value)
    for looked in ("empty/COMPLETE", "empty/dcp/.metadata", "empty/high/.metadata", "empty/low/.metadata"):
        assert looked in message
    assert "legacy root" in message and "none is there" in message
    with pytest.raises(ConfigError, match="the path does not exist"):
        sft_init.load_initial_weights(tmp_path / "nowhere", fresh_experts(), log=print)


def tiny_inputs() -> dict:
    gen = torch.Generator().manual_seed(3)
    return dict(
        hidden_states=torch.randn(1, 36, 2, 4, 4, generator=gen),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(1, 6, 32, generator=gen),
    )


def test_sharded_experts_load_on_two_gloo_ranks(tmp_path, sft):
    """FSDP2 (high) and TP2 (low) over 2 ranks; and an FSDP2-written project checkpoint read into TP2."""
    train, ema = sft
    path = write_reference(tmp_path / "ckpt", train, {"transformer": ema["transformer"]})
    torch.save({"transformer": ema["transformer"], "transformer_2": train["transformer_2"]}, tmp_path / "expected.pt")
    out = tmp_path / "out"
    out.mkdir()
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(REPO / "tests/sft_init_worker.py"), str(path), str(tmp_path / "expected.pt"), str(out),
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    for rank in range(2):
        r = json.loads((out / f"rank{rank}.json").read_text())
        assert r["high_sharded"] and r["low_dtensors"] > 0
        assert r["sources"] == {"high": "ema", "low": "training"}
        assert (r["high_diff"], r["low_diff"]) == (0.0, 0.0)
        assert r["own_layout"] == "videogrpo" and r["own_before"] > 0.1
        assert r["own_diff"] == 0.0 and r["own_loaded"] == r["own_tensors"]
        assert r["warnings"] == []
