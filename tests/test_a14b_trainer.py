"""The trainer on the two-expert I2V-A14B path (docs/reference-system.md#a14b), on the tiny two-expert model in this
process:
routing in rollout and replay, gradients only to the expert that served, joint clipping, both experts in
checkpoints and the export, a resume that ends bit-identical."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from videogrpo.models.i2v import boundary_of

from harness import metrics, solo_config, train, train_in_process, trainer_in_process


@pytest.fixture(scope="module")
def tiny_i2v(tmp_path_factory):
    from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline

    out = tmp_path_factory.mktemp("tiny_i2v") / "pipeline"
    save_tiny_i2v_pipeline(out, 0)
    return out


def a14b(**sections) -> dict:
    cfg = solo_config(
        model={"kind": "i2v_a14b"},
        grpo={"shared_prompts": False, "eta_range": [0.0, 1.0], "sample_batch_size": 2},
        train={"max_steps": 2, "save_steps": 1000, "experts": "both"},
    )
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def expert_weights(out, folder: str) -> dict:
    return load_file(out / "final" / folder / "diffusion_pytorch_model.safetensors")


def record_calls(trainer) -> list[tuple[str, float, bool]]:
    """(expert, timestep, with gradients) of every forward of every expert."""
    calls = []
    for expert in trainer.experts.experts:

        def hook(module, args, kwargs, name=expert.name):
            calls.append((name, float(kwargs["timestep"][0]), torch.is_grad_enabled()))

        expert.module.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def test_every_step_goes_to_the_expert_the_boundary_names_in_rollout_and_replay(tiny_i2v, dataset, tmp_path):
    trainer = trainer_in_process(a14b(), tmp_path, tiny_i2v, dataset)
    calls = record_calls(trainer)
    trainer.run()
    _, boundary = boundary_of(tiny_i2v)
    assert boundary == 875
    rollout = [c for c in calls if not c[2]]
    replay = [c for c in calls if c[2]]
    for name, t, _ in calls:
        assert name == ("high" if t >= boundary else "low"), (name, t)
    # 2 updates x 8 steps x 2 chunks (4 members, 2 per forward) in rollout; both experts serve both phases.
    assert len(rollout) == 2 * 8 * 2
    assert {n for n, *_ in rollout} == {n for n, *_ in replay} == {"high", "low"}
    # Replay recomputes exactly the recorded steps' timesteps: the same stored sigma, the same expert.
    assert {t for _, t, _ in replay} <= {t for _, t, _ in rollout}
    final = tmp_path / "final"
    assert (final / "transformer/config.json").is_file() and (final / "transformer_2/config.json").is_file()
    base_high = load_file(tiny_i2v / "transformer/diffusion_pytorch_model.safetensors")
    base_low = load_file(tiny_i2v / "transformer_2/diffusion_pytorch_model.safetensors")
    for base, trained in (
        (base_high, expert_weights(tmp_path, "transformer")),
        (base_low, expert_weights(tmp_path, "transformer_2")),
    ):
        assert set(base) == set(trained) and any(not torch.equal(base[k], trained[k]) for k in base)
    state = json.loads((final / "training_state.json").read_text())
    assert set(state["layout"]) == {"high", "low"}


def test_an_expert_that_served_no_replayed_step_gets_no_gradient(tiny_i2v, dataset, tmp_path, monkeypatch):
    """Only high-noise steps (0 and 1, t >= 875) replayed: the low-noise expert is not updated at all (no
    moments, no weight decay), the high-noise one is, and the joint norm is the high expert's alone."""
    import videogrpo.grpo.sde_window as sde_window_module

    monkeypatch.setattr(sde_window_module, "trained_timesteps", lambda *a: [0, 1])  # what replayed_steps asks
    trainer = trainer_in_process(a14b(), tmp_path, tiny_i2v, dataset)
    served = []
    original = trainer.experts.step

    def step(lr, max_norm):
        served.append({e.name: sum(p.grad is not None for p in e.params) for e in trainer.experts.experts})
        return original(lr, max_norm)

    trainer.experts.step = step
    trainer.run()
    assert all(counts["low"] == 0 and counts["high"] > 0 for counts in served)
    # The run's last checkpoint made the low expert's AdamW state (torch's DCP state dict steps an optimizer that
    # never stepped once, at lr 0 with zero gradients): its moments exist, and are zero.
    low = {e.name: e for e in trainer.experts.experts}["low"]
    assert low.optimizer.state and all(
        not state["exp_avg"].any() and not state["exp_avg_sq"].any() for state in low.optimizer.state.values()
    )
    base_low = load_file(tiny_i2v / "transformer_2/diffusion_pytorch_model.safetensors")
    trained_low = expert_weights(tmp_path, "transformer_2")
    assert all(torch.equal(base_low[k], trained_low[k]) for k in base_low)
    base_high = load_file(tiny_i2v / "transformer/diffusion_pytorch_model.safetensors")
    trained_high = expert_weights(tmp_path, "transformer")
    assert any(not torch.equal(base_high[k], trained_high[k]) for k in base_high)


def test_one_expert_trains_alone_and_serves_every_step(tiny_i2v, dataset, tmp_path):
    """train.experts: low loads only transformer_2; it serves every step and is the one folder exported."""
    trainer = trainer_in_process(a14b(train={"experts": "low"}), tmp_path, tiny_i2v, dataset)
    calls = record_calls(trainer)
    trainer.run()
    assert {name for name, *_ in calls} == {"low"} and max(t for _, t, _ in calls) >= 875
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == ["training_state.json", "transformer_2"]


def test_joint_clipping_takes_one_norm_over_both_experts():
    """One norm over both experts' gradients, both scaled by one factor before their optimizers step (SGD at
    lr 1 here, so each weight moves by exactly its clipped gradient); the returned norm is the one before."""
    from videogrpo.grpo.experts import Expert, Experts

    torch.manual_seed(0)
    modules = [torch.nn.Linear(4, 3), torch.nn.Linear(5, 2)]
    experts = []
    for name, module in zip(("high", "low"), modules):
        params = list(module.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        experts.append(Expert(name, module, params, torch.optim.SGD(params, lr=1.0)))
    before = [p.detach().clone() for m in modules for p in m.parameters()]
    grads = [p.grad.clone() for m in modules for p in m.parameters()]
    joint = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item()
    norm = Experts(experts, routed=True).step(lr=1.0, max_norm=joint / 2)
    assert norm == pytest.approx(joint, rel=1e-6)
    scale = (joint / 2) / (joint + 1e-6)
    after = [p.detach() for m in modules for p in m.parameters()]
    for b, a, g in zip(before, after, grads):
        torch.testing.assert_close(b - a, g * scale, rtol=1e-6, atol=1e-7)
    assert all(p.grad is None for m in modules for p in m.parameters())  # cleared after the step


def test_a_resumed_two_expert_run_ends_bit_identical(tiny_i2v, dataset, tmp_path, monkeypatch):
    """4 updates with a checkpoint after update 2 (both experts and both AdamWs in one DCP save): a run that
    fails in update 3 and is resumed ends with the uninterrupted run's weights of both experts, byte for byte."""
    cfg = a14b(train={"max_steps": 4, "save_steps": 2, "experts": "both"})
    trainer_in_process(cfg, tmp_path / "whole", tiny_i2v, dataset).run()
    broken = trainer_in_process(cfg, tmp_path / "cut", tiny_i2v, dataset)
    original = type(broken).update

    def update(self, action, prepared):
        if action.update == 3:
            raise KeyboardInterrupt("killed in update 3")
        return original(self, action, prepared)

    monkeypatch.setattr(type(broken), "update", update)
    with pytest.raises(KeyboardInterrupt):
        broken.run()
    monkeypatch.setattr(type(broken), "update", original)
    state = json.loads((tmp_path / "cut/checkpoints/step-00000002/state.json").read_text())
    assert state["parts"] == ["high", "low"]
    resumed = trainer_in_process(cfg, tmp_path / "cut", tiny_i2v, dataset)
    resumed.run()
    for folder in ("transformer", "transformer_2"):
        whole = (tmp_path / "whole/final" / folder / "diffusion_pytorch_model.safetensors").read_bytes()
        cut = (tmp_path / "cut/final" / folder / "diffusion_pytorch_model.safetensors").read_bytes()
        assert whole == cut, folder


def test_more_nodes_for_the_a14b_recipe_are_refused_unless_the_batch_is_re_derived():
    """Prompts are dealt per data replica (4 of TP 2 on 8 GPUs): 4 nodes make 16 replicas and 64 prompts a
    step; the message gives the numbers and the batch_size that keeps 16."""
    import yaml

    from videogrpo import config
    from videogrpo.errors import ConfigError

    from conftest import REPO

    data = yaml.safe_load((REPO / "config/recipes/rl_a14b_rule.yaml").read_text())
    assert config.topology_problems(config.from_dict(data, partial=True)) == []
    data["parallel"]["nodes"] = 4
    with pytest.raises(ConfigError) as refused:
        config.from_dict(data, partial=True)
    message = str(refused.value)
    assert "train.batch_size 4 x 16 data replicas (world size 32 = nodes 4 x procs_per_node 8" in message
    assert "= 64; to keep 16 prompts per step set train.batch_size: 1" in message
    data["train"]["batch_size"] = 1
    assert config.topology_problems(config.from_dict(data, partial=True)) == []


# ---- under torchrun: one TP pair (2 gloo processes; TP 2 x FSDP 2 on 4 runs in tests/test_a14b_workflow.py) ----

TP_FSDP = dict(
    parallel={"procs_per_node": 2, "tensor_parallel": 2, "data_parallel": "fsdp"},
    grpo={"prompts_per_step": 2},
    train={"batch_size": 2, "max_steps": 4, "save_steps": 2},
)


def tp_config(**sections) -> dict:
    cfg = a14b(**TP_FSDP)
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


@pytest.fixture(scope="module")
def tp_uninterrupted(tiny_i2v, dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_uninterrupted")
    assert train(tp_config(), out, tiny_i2v, dataset)
    return out


def test_a_tp_pair_trains_what_one_unsharded_process_trains(tp_uninterrupted, tiny_i2v, dataset, tmp_path):
    """A TP pair (FSDP2 over its one data replica) against one process: the same rewards (only tp_rank 0
    scores, counted once), losses and gradient norms and, within AdamW's round-off, the same weights of both
    experts."""
    state = json.loads((tp_uninterrupted / "final/training_state.json").read_text())
    for name in ("high", "low"):
        assert state["layout"][name]["mesh_dims"] == ["dp", "tp"] and state["layout"][name]["mesh_shape"] == [1, 2]
    solo = a14b(grpo={"prompts_per_step": 2}, train={"batch_size": 2, "max_steps": 4, "save_steps": 2})
    train_in_process(solo, tmp_path, tiny_i2v, dataset)
    # TP's partial sums round differently (outputs within 1e-6): the decoded videos, and so the rewards, move by
    # rounding. A TP peer counted twice would double the loss and the gradient norm.
    for a, b in zip(metrics(tp_uninterrupted), metrics(tmp_path), strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-3)
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], rel=1e-2, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-2)
    # AdamW moves a weight by at most about lr per update, whatever its gradient's scale: the rounding of a
    # near-zero gradient can use that up, so per weight only the bound holds. The updates as a whole agree to a
    # few % (seen: 6 % after 3 updates, the rewards' rounding feeding the advantages); a wrong TP gradient would
    # move them by about their own size.
    updates = len(metrics(tmp_path))
    for folder in ("transformer", "transformer_2"):
        sharded, plain = expert_weights(tp_uninterrupted, folder), expert_weights(tmp_path, folder)
        base = load_file(tiny_i2v / folder / "diffusion_pytorch_model.safetensors")
        assert sharded.keys() == plain.keys() == base.keys()
        assert max((sharded[k] - plain[k]).abs().max().item() for k in base) <= 1e-4 * updates
        apart = sum((sharded[k] - plain[k]).double().square().sum().item() for k in base) ** 0.5
        moved = sum((plain[k] - base[k]).double().square().sum().item() for k in base) ** 0.5
        assert apart < 0.2 * moved, (folder, apart / moved)


def test_sigkill_of_a_two_expert_tp_run_then_rerun_ends_bit_identical(tp_uninterrupted, tiny_i2v, dataset, tmp_path):
    cfg = tp_config()
    assert not train(
        cfg, tmp_path, tiny_i2v, dataset, kill_when=lambda out: (out / "checkpoints/step-00000002/COMPLETE").exists()
    )
    assert not (tmp_path / "final").exists()
    assert train(cfg, tmp_path, tiny_i2v, dataset)
    assert "resumed from" in (tmp_path / "log.txt").read_text()
    for folder in ("transformer", "transformer_2"):
        done = tp_uninterrupted / "final" / folder / "diffusion_pytorch_model.safetensors"
        assert (tmp_path / "final" / folder / "diffusion_pytorch_model.safetensors").read_bytes() == done.read_bytes()


def test_both_experts_start_from_the_reference_sft_checkpoints_ema(tiny_i2v, dataset, tmp_path):
    """train.resume_from naming the reference's per-expert DCP checkpoint, reset_dataloader true: each expert
    takes that expert's EMA copy, and the run starts at its first batch."""
    from sft_ckpt import cloned, shifted, tiny_expert, write_reference

    train = {"transformer": cloned(tiny_expert(1)), "transformer_2": cloned(tiny_expert(2))}
    ema = {key: shifted(sd, 0.5) for key, sd in train.items()}
    source = write_reference(tmp_path / "sft/checkpoint-100", train, ema)
    cfg = a14b(train={"resume_from": str(source), "reset_dataloader": True})
    trainer = trainer_in_process(cfg, tmp_path / "run", tiny_i2v, dataset)
    try:
        assert trainer._resume() == 0
        for name, key in (("high", "transformer"), ("low", "transformer_2")):
            held = trainer.experts.modules()[name].state_dict()
            assert all(torch.equal(held[k], v) for k, v in ema[key].items()), name
    finally:
        trainer.scorer.close()


def test_the_trainers_two_expert_checkpoint_initialises_another_run(tiny_i2v, dataset, tmp_path):
    """A checkpoint this trainer wrote (both experts in one DCP) read weights-only by sft_init, as a later run's
    train.resume_from does: each expert gets its own weights."""
    from sft_ckpt import tiny_expert

    from videogrpo.grpo import sft_init

    trainer_in_process(a14b(train={"save_steps": 2}), tmp_path, tiny_i2v, dataset).run()
    fresh = {"high": tiny_expert(7), "low": tiny_expert(8)}
    report = sft_init.load_initial_weights(tmp_path / "checkpoints/step-00000002", fresh, log=print)
    assert report.layout == "videogrpo"
    for name, folder in (("high", "transformer"), ("low", "transformer_2")):
        final = expert_weights(tmp_path, folder)
        assert all(torch.equal(fresh[name].state_dict()[k], v) for k, v in final.items()), name


def test_the_video_sides_follow_the_models_vae():
    """I2V-A14B's Wan2.1 VAE compresses space by 8 (sides multiples of 16), TI2V's Wan2.2 VAE by 16 (of 32)."""
    from videogrpo import config

    i2v = config.from_dict(a14b(video={"height": 48, "width": 80}))
    assert not [p for p in config.problems(i2v) if p.startswith("video.")]
    ti2v = solo_config(video={"height": 48, "width": 64})
    with pytest.raises(
        Exception, match=r"video.height = 48: must be a multiple of 32 \(model.kind ti2v: VAE factor 16"
    ):
        config.from_dict(ti2v)


def test_a_vision_refiner_trains_beside_both_experts(tiny_i2v, dataset, tmp_path):
    """The A14B's two experts and a vision-language prompt refiner that sees each sample's first frame (as Wan2.2's
    own image-to-video prompt extension does) train together: all three move, each exported."""
    from videogrpo.demo.tiny_refiner import save_tiny_refiner

    save_tiny_refiner(tmp_path / "seer", 0, vision=True)
    cfg = a14b(train={"max_steps": 1})
    cfg["refiners"] = {
        "experts": [{"name": "seer", "source": "tiny", "vision": True, "max_new_tokens": 32, "lr": 1e-3}]
    }
    trainer_in_process(cfg, tmp_path / "run", tiny_i2v, dataset, refiners={"seer": tmp_path / "seer"}).run()
    out = tmp_path / "run"
    for folder in ("transformer", "transformer_2"):
        trained, base = (
            expert_weights(out, folder),
            load_file(tiny_i2v / folder / "diffusion_pytorch_model.safetensors"),
        )
        assert any((trained[k] - base[k]).abs().max() > 0 for k in base), folder
    refined, initial = (
        load_file(out / "final/refiners/seer/model.safetensors"),
        load_file(tmp_path / "seer/model.safetensors"),
    )
    assert any((refined[k] - initial[k]).abs().max() > 0 for k in initial)
    [line] = metrics(out)
    assert line["refiner/seer/rewrites"] == 4 and line["refiner/seer/version"] == 1
