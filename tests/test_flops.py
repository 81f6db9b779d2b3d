"""The Wan transformer's FLOPs formula against torch's flop counter, and the trainer's speed metrics."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from videogrpo.grpo import flops, sde_window, tracking
from videogrpo.models.shapes import SMALL_I2V_EXPERT, SMALL_TI2V, TINY_TI2V, WAN_I2V_A14B_EXPERT, WAN_TI2V_5B

from harness import metrics, solo_config, trainer_in_process

CASES = {
    # name: (config, latent [C, F, h, w], text tokens, batch, per-token timestep, device)
    "tiny": (TINY_TI2V, (48, 3, 8, 8), 16, 2, True, "cpu"),
    "small": (SMALL_TI2V, (48, 3, 16, 16), 24, 2, True, "cpu"),
    "small-i2v": (SMALL_I2V_EXPERT, (36, 2, 16, 24), 20, 1, False, "cpu"),
    # The real shapes, counted on the meta device (shapes only, no memory, about a second each).
    "5b-512x512x81": (WAN_TI2V_5B, (48, 21, 32, 32), 512, 1, True, "meta"),
    "a14b-expert-256x256x161": (WAN_I2V_A14B_EXPERT, (36, 41, 32, 32), 512, 1, False, "meta"),
}


def counted(config, latent, text, batch, per_token, device, backward: bool, checkpointing: bool) -> int:
    """What torch's flop counter sees of a forward (and its backward) of a random transformer."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = WanTransformer3DModel(**config)
    # The counter has no formula for CPU's fused attention kernel (it would count 0); the math backend's
    # matmuls it counts. CUDA's flash and memory-efficient kernels it counts directly.
    model.set_attention_backend("_native_math")
    if checkpointing:
        model.enable_gradient_checkpointing()
    x = torch.randn(batch, *latent, device=device)
    tokens = flops.video_tokens(latent, config["patch_size"])
    timestep = torch.rand(batch, tokens, device=device) if per_token else torch.rand(batch, device=device)
    embeds = torch.randn(batch, text, config["text_dim"], device=device)
    with FlopCounterMode(display=False) as counter:
        out = model(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds, return_dict=False)[0]
        if backward:
            out.square().mean().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("mode", ["forward", "training", "training-checkpointed"])
def test_the_formula_agrees_with_torchs_flop_counter(name, mode):
    """The issue asks for 5 %; both count the same matmuls, so they agree exactly."""
    config, latent, text, batch, per_token, device = CASES[name]
    tokens = flops.video_tokens(latent, config["patch_size"])
    formula = flops.forward_flops(config, tokens, text, batch, per_token_timestep=per_token)
    checkpointing = mode == "training-checkpointed"
    expected = formula.total if mode == "forward" else formula.training(checkpointing)
    seen = counted(config, latent, text, batch, per_token, device, mode != "forward", checkpointing)
    assert seen > 0
    assert expected == seen, (name, mode, expected / seen)


def test_recompute_and_guidance_and_reference_are_counted_where_the_trainer_spends_them():
    per = flops.forward_flops(TINY_TI2V, 48, 16)
    plain = flops.step_flops(per, 48, 8, 3, 10, True, False, False, False)
    assert plain.train == 8 * 3 * (3 * per.total - per.no_input_grad)
    assert plain.inference == 8 * 10 * per.total
    assert plain.tokens == 8 * (3 + 10) * 48
    checkpointed = flops.step_flops(per, 48, 8, 3, 10, True, False, False, True)
    assert checkpointed.train - plain.train == 8 * 3 * per.blocks
    guided = flops.step_flops(per, 48, 8, 3, 10, True, True, False, False)
    assert (guided.train, guided.inference, guided.tokens) == (2 * plain.train, 2 * plain.inference, 2 * plain.tokens)
    with_reference = flops.step_flops(per, 48, 8, 3, 10, False, False, True, False)
    assert with_reference.train == plain.train and with_reference.inference == 8 * 3 * per.total


def test_the_peak_is_the_devices_known_dense_bf16_or_none():
    assert flops.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert flops.peak_bf16_flops("NVIDIA H200") == 989e12
    assert flops.peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert flops.peak_bf16_flops("NVIDIA L40S") == 362e12
    assert flops.peak_bf16_flops("NVIDIA L4") == 121e12
    assert flops.peak_bf16_flops("NVIDIA H200", sm_count=66) == pytest.approx(989e12 / 2)  # a MIG half
    assert flops.peak_bf16_flops("Tesla V100-SXM2-16GB") is None
    assert flops.peak_bf16_flops("NVIDIA GeForce RTX 3090") is None
    assert flops.device_peak_flops(torch.device("cpu")) is None


@pytest.mark.parametrize("window", [{}, {"sde_window_size": 2, "sde_window_tail": "dpm_solver"}], ids=["all", "tail"])
def test_the_trainer_logs_the_flops_of_the_forwards_it_runs(window, tiny_model, dataset, tmp_path, monkeypatch, capsys):
    """Every transformer forward of a delayed-replay run with guidance, KL reference and checkpointing is
    counted (by its real shapes) and set against the metrics line of the update it belongs to; with an SDE window's
    DPM-Solver tail, whose rollouts take fewer forwards, their count per batch."""
    cfg = solo_config(
        grpo={"delayed_replay": True, "kl_coeff": 0.1, "guidance_scale": 2.0, **window},
        train={"max_steps": 3, "save_steps": 0, "gradient_checkpointing": True},
    )
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    config = trainer.model.transformer.config
    calls: list[int] = []
    per_update: list[int] = []

    def count(module, args, kwargs):
        x, embeds, timestep = kwargs["hidden_states"], kwargs["encoder_hidden_states"], kwargs["timestep"]
        tokens = flops.video_tokens(tuple(x.shape[1:]), tuple(config.patch_size))
        per = flops.forward_flops(config, tokens, embeds.shape[1], x.shape[0], timestep.ndim == 2)
        calls.append(per.training(True) if torch.is_grad_enabled() else per.total)

    for module in (trainer.model.transformer, trainer.experts.reference):
        module.register_forward_pre_hook(count, with_kwargs=True)
    record = tracking.Tracker.record

    def split(self, line):
        per_update.append(sum(calls))
        calls.clear()
        record(self, line)

    monkeypatch.setattr(tracking.Tracker, "record", split)
    trainer.run()
    lines = metrics(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3]
    # Update 1 follows the prefill (batch 0's rollout, which no update's step times), update 3 is a flush
    # that rolls out nothing.
    assert [m["rolled_out_batches"] for m in lines] == [[0, 1], [2], []]
    per = flops.forward_flops(config, lines[0]["video_tokens_per_sample"], trainer.model.max_text_tokens)
    g = trainer.cfg.grpo
    forwards = sde_window.rollout_forwards(g, sde_window.window(g, trainer.cfg.train.seed, 0))
    assert (forwards < g.sampling_steps) == bool(window)
    rollout = 1 * 4 * forwards * 2 * per.total  # prompts x group x steps x guidance
    assert per_update[0] == lines[0]["model_flops_per_update"] + lines[0]["inference_flops_per_update"] + rollout
    for seen, line in zip(per_update[1:], lines[1:]):
        assert seen == line["model_flops_per_update"] + line["inference_flops_per_update"]
    assert lines[2]["inference_flops_per_update"] < lines[1]["inference_flops_per_update"]
    for line in lines:
        assert line["time_tokens_per_s"] > 0
        assert line["time_mfu"] is None  # CPU: no peak to measure against
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[train] step ")]
    assert len(progress) == 3 and all(" tokens/s | " in line and "MFU" not in line for line in progress)
