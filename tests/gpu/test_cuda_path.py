"""The CUDA path of the trainer on one GPU: FSDP2 with bf16 compute, attention backends, compiled blocks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from videogrpo.demo.smoke_run import one_process_config, synthetic_inputs, train_one_process
from videogrpo.demo.tiny_ti2v import save_tiny_pipeline
from videogrpo.models.shapes import TINY_TI2V_5B_LAYOUT

from harness import TINY


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("gpu")
    model = root / "model"
    save_tiny_pipeline(model, seed=0)
    dataset, kit = synthetic_inputs(root)
    return root, model, dataset, kit


def test_fsdp2_bf16_delayed_replay_on_one_gpu(inputs):
    """A few updates of the real worker under torchrun: finite metrics, the device's peak memory and an MFU."""
    root, model, dataset, kit = inputs
    cfg = one_process_config(TINY, kit, 17, 64, 64, 4, 4, 3, cuda=True)
    metrics = train_one_process(root, "fsdp2-bf16", cfg, model, dataset)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert math.isfinite(m["policy_loss"]) and math.isfinite(m["grad_norm"]), m
        assert m["peak_memory_bytes"] > 0, "the trainer read no CUDA peak memory"
        assert m["time_mfu"] is not None and 0 < m["time_mfu"] < 1, m["time_mfu"]
    layout = json.loads((root / "fsdp2-bf16/final/training_state.json").read_text())["layout"]
    assert layout["sharded"] == layout["parameters"] and layout["dtypes"] == ["float32"], layout  # FSDP2 ran
    final = root / "fsdp2-bf16/final/transformer"
    from safetensors import safe_open

    with safe_open(next(final.glob("*.safetensors")), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"F32"}, f"exported weights must be the float32 master weights, found {dtypes}"


@pytest.mark.parametrize("backend", ["_native_cudnn", "_native_flash", "_native_efficient", "flex"])
def test_attention_backends_agree_with_native(backend):
    from diffusers.models.attention_dispatch import attention_backend, dispatch_attention_fn

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 1024, 24, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    with attention_backend("native"):
        expected = dispatch_attention_fn(q, k, v).float()
    with attention_backend(backend):
        found = dispatch_attention_fn(q, k, v).float()
    assert (found - expected).abs().max().item() < 2e-2


def test_compiled_blocks_match_eager_on_cuda():
    from diffusers import WanTransformer3DModel

    from videogrpo.parallel import fsdp

    torch.manual_seed(0)
    model = WanTransformer3DModel(**TINY_TI2V_5B_LAYOUT).cuda().eval()
    x = torch.randn(1, 48, 3, 16, 16, device="cuda")
    t = torch.full((1,), 500.0, device="cuda")
    text = torch.randn(1, 16, TINY_TI2V_5B_LAYOUT["text_dim"], device="cuda")
    with torch.no_grad():
        eager = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        fsdp.compile_blocks(model)
        compiled = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    assert torch.allclose(compiled, eager, atol=1e-4, rtol=1e-4)


def test_the_same_velocity_on_cuda_as_on_cpu(inputs):
    """float32 on both: the device changes nothing but round-off (placement bugs change everything)."""
    from videogrpo.models.wan import WanTI2V

    _, model_dir, _, _ = inputs
    out = {}
    for device in ("cpu", "cuda"):
        model = WanTI2V(model_dir, torch.device(device))
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(2, 48, 5, 4, 4, generator=gen).to(device)
        embeds = model.encode_prompts(["a red square moves", "a bar grows"])
        out[device] = model.velocity(model.transformer, x, 0.5, embeds).cpu()
    assert torch.allclose(out["cuda"], out["cpu"], atol=1e-4, rtol=1e-4)
