"""LoRA training (train.lora_rank > 0, docs/options.md#lora) on the tiny models: adapters trained on a frozen base in
this process (TI2V and both A14B experts) and on two gloo ranks under FSDP2, resumed bit-identically, checkpointed
without the base, exported as Diffusers loads LoRA weights and evaluated as base + adapters; tensor parallel
refused; the memory plan and the FLOP count of the trainable parameters."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.grpo import flops, lora
from videogrpo.models import lora as exported
from videogrpo.preflight import memory_plan, model_shape

from harness import metrics, solo_config, train, trainer_config, trainer_in_process, without_times

LORA = {"lora_rank": 4, "lora_export_merged": True}
TINY_ADAPTERS = 8448
"""Adapter parameters of the tiny default at rank 4 (each block's 8 attention and 2 FFN projections)."""


def lora_config(**sections) -> dict:
    cfg = solo_config(train={"max_steps": 2, "save_steps": 1, "keep_checkpoints": 3, **LORA})
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def adapters_of(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters() if lora.is_adapter(k)}


def base_of(module) -> dict[str, torch.Tensor]:
    """The frozen base by its Diffusers names (peft's wrapped layers keep theirs under `base_layer`)."""
    return {k.replace(".base_layer", ""): v.detach() for k, v in module.named_parameters() if not lora.is_adapter(k)}


@pytest.fixture(scope="module")
def ti2v(tiny_model, dataset, tmp_path_factory):
    """A two-update LoRA run in this process: its trainer, the adapters it started from, torch's RNG after the
    trainer was built, and the same for a trainer of the same run without LoRA."""
    out = tmp_path_factory.mktemp("lora")
    plain = trainer_in_process(solo_config(), out / "plain", tiny_model, dataset)
    plain.scorer.close()
    rng_plain = torch.get_rng_state()
    trainer = trainer_in_process(lora_config(), out, tiny_model, dataset)
    rng_lora = torch.get_rng_state()
    initial = adapters_of(trainer.experts.policy)
    trainer.run()
    return out, trainer, initial, torch.equal(rng_plain, rng_lora)


def test_the_adapters_train_and_the_base_stays_bit_identical(ti2v, tiny_model):
    out, trainer, initial, _ = ti2v
    module = trainer.experts.policy
    expert = trainer.experts.experts[0]
    assert {id(p) for p in expert.params} == {id(p) for n, p in module.named_parameters() if lora.is_adapter(n)}
    assert {id(p) for g in expert.optimizer.param_groups for p in g["params"]} == {id(p) for p in expert.params}
    trained = adapters_of(module)
    assert sum(v.numel() for v in trained.values()) == TINY_ADAPTERS and len(trained) == 40
    assert all(v.dtype == torch.float32 for v in trained.values())  # float32 master weights
    assert all(not torch.equal(trained[k], initial[k]) for k in trained)  # every adapter moved
    assert all(not initial[k].any() for k in initial if ".lora_B." in k)  # B starts at zero: the base model
    original = load_file(tiny_model / "transformer/diffusion_pytorch_model.safetensors")
    base = base_of(module)
    assert base.keys() == original.keys()
    assert all(torch.equal(base[k], original[k]) for k in original)
    assert all(not p.requires_grad for n, p in module.named_parameters() if not lora.is_adapter(n))
    layout = json.loads((out / "final/training_state.json").read_text())["layout"]
    assert layout["trainable_numel"] == TINY_ADAPTERS and layout["parameters"] == 40
    assert layout["frozen_numel"] == sum(v.numel() for v in original.values())


def test_the_adapters_are_built_alike_every_time_and_draw_nothing_from_the_run(ti2v, tiny_model, dataset, tmp_path):
    _, _, initial, same_rng = ti2v
    assert same_rng  # building the adapters left torch's RNG where the run without LoRA has it
    again = trainer_in_process(lora_config(), tmp_path, tiny_model, dataset)
    again.scorer.close()
    rebuilt = adapters_of(again.experts.policy)
    assert rebuilt.keys() == initial.keys() and all(torch.equal(rebuilt[k], initial[k]) for k in initial)


def test_a_run_resumed_from_its_checkpoint_ends_bit_identical(ti2v, tiny_model, dataset, tmp_path):
    out, *_ = ti2v
    (tmp_path / "checkpoints").mkdir()
    shutil.copytree(out / "checkpoints/step-00000001", tmp_path / "checkpoints/step-00000001")
    shutil.copy(out / "checkpoints/metrics.jsonl", tmp_path / "checkpoints/metrics.jsonl")
    resumed = trainer_in_process(lora_config(), tmp_path, tiny_model, dataset)
    assert resumed._resume() == 1
    resumed.run()
    assert same_export(tmp_path / "final/transformer", out / "final/transformer")
    assert without_times(metrics(tmp_path)) == without_times(metrics(out))


def same_export(a, b) -> bool:
    """Two exported folders hold the same files, byte for byte (the adapters' header is written in one order:
    grpo.lora.canonical_header)."""
    names = (exported.ADAPTERS_FILE, "diffusion_pytorch_model.safetensors")
    return all((a / name).read_bytes() == (b / name).read_bytes() for name in names)


def test_the_adapters_header_is_written_in_one_order(tmp_path):
    """safetensors writes its metadata map in hash order: the same adapters could be two files with two digests.
    The header is rewritten sorted, so any order gives the same bytes, and readers see the same tensors."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from videogrpo.grpo.lora import canonical_header

    tensors = {"transformer.b.lora_B.weight": torch.ones(2, 3), "transformer.a.lora_A.weight": torch.arange(6.0)}
    files = []
    for i, order in enumerate((("format", "lora", "z"), ("z", "lora", "format"))):
        path = tmp_path / f"{i}.safetensors"
        save_file(tensors, str(path), metadata={k: {"format": "pt", "lora": '{"r": 4}', "z": "1"}[k] for k in order})
        canonical_header(path)
        files.append(path)
    assert files[0].read_bytes() == files[1].read_bytes()
    assert int.from_bytes(files[0].read_bytes()[:8], "little") % 8 == 0
    with safe_open(files[0], "pt") as f:
        assert f.metadata() == {"format": "pt", "lora": '{"r": 4}', "z": "1"}
        assert all(torch.equal(f.get_tensor(k), v) for k, v in tensors.items())


def checkpoint_tensors(step_dir) -> dict[str, int]:
    """Every tensor of a checkpoint's DCP by key, as its element count (from the metadata: nothing loaded)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(step_dir / "dcp")).read_metadata()
    return {k: math.prod(v.size) for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def test_the_checkpoint_holds_the_adapters_and_their_adamw_state_only(ti2v, tiny_model):
    out, *_ = ti2v
    held = checkpoint_tensors(out / "checkpoints/step-00000002")
    weights = {k: n for k, n in held.items() if k.startswith("model.")}
    assert weights and all(lora.is_adapter(k) for k in weights)
    assert sum(weights.values()) == TINY_ADAPTERS
    moments = {k: n for k, n in held.items() if k.endswith((".exp_avg", ".exp_avg_sq"))}
    assert all(lora.is_adapter(k) for k in moments) and sum(moments.values()) == 2 * TINY_ADAPTERS
    base = sum(v.numel() for v in load_file(tiny_model / "transformer/diffusion_pytorch_model.safetensors").values())
    assert sum(held.values()) < 3 * TINY_ADAPTERS + 100 < base  # the steps' scalars beside the adapters' state


def transformer_output(transformer) -> torch.Tensor:
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, config.in_channels, 2, 8, 8, generator=generator)
    text = torch.randn(1, 8, config.text_dim, generator=generator)
    with torch.no_grad():
        return transformer(x, torch.tensor([500.0]), text, return_dict=False)[0]


def test_the_export_loads_with_diffusers_and_evaluates_as_the_base_with_the_adapters_fused(ti2v, tiny_model, tmp_path):
    from diffusers import WanPipeline, WanTransformer3DModel

    from videogrpo.evaluation import sampling
    from videogrpo.grpo.checkpoint import validate_export

    out, *_ = ti2v
    folder = out / "final/transformer"
    merged = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(str(tiny_model), torch_dtype=torch.float32)
    base = transformer_output(pipe.transformer)
    pipe.load_lora_weights(str(folder))  # Diffusers' own loader, as a user loads the run's adapters
    loaded = transformer_output(pipe.transformer)
    assert (loaded - base).abs().max() > 1e-4  # the adapters change the model
    assert torch.allclose(loaded, transformer_output(merged), atol=1e-6, rtol=0)  # unfused vs merged: rounding
    # Without the merged weights the evaluation fuses the adapters into the pipeline's base transformer.
    adapters_only = tmp_path / "final/transformer"
    adapters_only.mkdir(parents=True)
    shutil.copy(folder / exported.ADAPTERS_FILE, adapters_only)
    cfg = config.from_dict(lora_config())
    fused = sampling.trained_transformer(adapters_only, tiny_model, torch.device("cpu"), cfg)
    state = merged.state_dict()
    assert fused.state_dict().keys() == state.keys()
    assert all(torch.equal(fused.state_dict()[k], state[k]) for k in state)
    record = validate_export(tmp_path / "final", tiny_model)
    assert record["loads"] and record["parameters"] == sum(v.numel() for v in state.values())
    shutil.rmtree(adapters_only)
    adapters_only.mkdir()
    with pytest.raises(Exception, match=r"holds neither a transformer \(config.json\) nor LoRA adapters"):
        sampling.trained_transformer(adapters_only, tiny_model, torch.device("cpu"), cfg)


@pytest.fixture(scope="module")
def tiny_i2v(tmp_path_factory):
    from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline

    out = tmp_path_factory.mktemp("tiny_i2v") / "pipeline"
    save_tiny_i2v_pipeline(out, 0)
    return out


def test_both_a14b_experts_train_adapters_that_diffusers_loads_into_transformer_and_transformer_2(
    tiny_i2v, dataset, tmp_path
):
    from diffusers import WanImageToVideoPipeline

    from videogrpo.evaluation import sampling
    from videogrpo.models.i2v import EXPERT_FOLDERS

    cfg = lora_config(
        model={"kind": "i2v_a14b"},
        grpo={"shared_prompts": False, "eta_range": [0.0, 1.0], "sample_batch_size": 2},
        train={"experts": "both", "lora_export_merged": False},
    )
    trainer = trainer_in_process(cfg, tmp_path, tiny_i2v, dataset)
    initial = {e.name: adapters_of(e.module) for e in trainer.experts.experts}
    trainer.run()
    for expert in trainer.experts.experts:  # each expert's adapters moved and were built apart
        now = adapters_of(expert.module)
        assert any(not torch.equal(now[k], initial[expert.name][k]) for k in now), expert.name
    high, low = (initial[name] for name in ("high", "low"))
    assert not any(torch.equal(high[k], low[k]) for k in high if ".lora_A." in k)
    final = tmp_path / "final"
    assert sorted(p.name for p in (final / "transformer").iterdir()) == [exported.ADAPTERS_FILE]
    pipe = WanImageToVideoPipeline.from_pretrained(str(tiny_i2v), torch_dtype=torch.float32)
    pipe.load_lora_weights(str(final / "transformer"))
    pipe.load_lora_weights(str(final / "transformer_2"), load_into_transformer_2=True)
    model = sampling.load_model(config.from_dict(cfg), tiny_i2v, torch.device("cpu"))
    experts = sampling.trained_weights(config.from_dict(cfg), model, final)
    for name, loaded in (("high", pipe.transformer), ("low", pipe.transformer_2)):
        assert EXPERT_FOLDERS[name] in ("transformer", "transformer_2")
        assert torch.allclose(transformer_output(experts[name]), transformer_output(loaded), atol=1e-6, rtol=0)


# Two gloo ranks sharing one prompt per step under FSDP2: the frozen base and the adapters sharded in the same blocks.
FSDP_LORA = dict(
    grpo={"prompts_per_step": 1},
    parallel={"data_parallel": "fsdp"},
    train={"max_steps": 2, "save_steps": 1, "keep_checkpoints": 3, **LORA},
)


def test_fsdp_shards_the_frozen_base_with_the_adapters_and_resumes_bit_identically(tiny_model, dataset, tmp_path):
    from videogrpo.evaluation import sampling

    cfg = trainer_config(**FSDP_LORA)
    assert train(cfg, tmp_path / "whole", tiny_model, dataset)
    stopped = lambda out: (out / "checkpoints/step-00000001/COMPLETE").exists()  # noqa: E731
    assert not train(cfg, tmp_path / "resumed", tiny_model, dataset, kill_when=stopped)
    assert train(cfg, tmp_path / "resumed", tiny_model, dataset)
    assert "resumed from" in (tmp_path / "resumed/log.txt").read_text()
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert same_export(whole / "final/transformer", resumed / "final/transformer")
    assert without_times(metrics(whole)) == without_times(metrics(resumed))
    layout = json.loads((whole / "final/training_state.json").read_text())["layout"]
    assert layout["sharded"] == layout["parameters"] == 40 and layout["mesh_shape"] == [2]
    assert layout["trainable_numel"] == TINY_ADAPTERS
    held = checkpoint_tensors(whole / "checkpoints/step-00000002")
    assert sum(n for k, n in held.items() if k.startswith("model.")) == TINY_ADAPTERS
    # The merged export is the gathered base plus the adapters: fusing the exported adapters into the untouched base
    # gives it bit for bit only if training left the sharded base as it was.
    adapters_only = tmp_path / "adapters"
    adapters_only.mkdir()
    shutil.copy(whole / "final/transformer" / exported.ADAPTERS_FILE, adapters_only)
    fused = sampling.trained_transformer(adapters_only, tiny_model, torch.device("cpu"), config.from_dict(cfg))
    merged = load_file(whole / "final/transformer/diffusion_pytorch_model.safetensors")
    assert all(torch.equal(fused.state_dict()[k], merged[k]) for k in merged)
    adapters = load_file(adapters_only / exported.ADAPTERS_FILE)
    assert all(k.startswith("transformer.") and (".lora_A." in k or ".lora_B." in k) for k in adapters)
    assert any(v.any() for k, v in adapters.items() if ".lora_B." in k)  # B moved off zero


def test_tensor_parallel_with_lora_is_refused_with_the_reason(repo):
    with pytest.raises(
        ConfigError,
        match=r"train.lora_rank = 4 with parallel.tensor_parallel = 2: LoRA is not supported under tensor "
        r"parallelism \(its plan shards the attention and FFN projections the adapters wrap\); set "
        r"parallel.tensor_parallel: 1",
    ):
        config.load([repo / "config/config.yaml"], {"train": {"lora_rank": 4}, "parallel": {"tensor_parallel": 2}})
    config.load([repo / "config/config.yaml"], {"train": {"lora_rank": 4}})  # the same without TP is fine


def peft_tiny(tiny_model, rank: int):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(tiny_model / "transformer")
    lora.add_adapters(model, config.from_dict(lora_config(train={"lora_rank": rank})), 0)
    return model


def test_the_memory_plan_counts_gradients_and_moments_for_the_adapters_only(tiny_model, repo):
    from videogrpo.models.shapes import WAN_TI2V_5B

    model = peft_tiny(tiny_model, 4)
    shape = model_shape.ModelShape.from_model_dir(tiny_model)
    targets = config.Config().train.lora_targets
    planned = lora.adapter_shapes(shape.params.shapes, 4, targets)
    assert planned == {k: tuple(p.shape) for k, p in model.named_parameters() if lora.is_adapter(k)}
    # The bytes a real optimizer holds after one step, against the tiny default's plan (replicate, two ranks).
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    transformer_output_with_grad = model(
        torch.randn(1, 48, 2, 4, 4), torch.tensor([500.0]), torch.randn(1, 8, 32), return_dict=False
    )[0]
    transformer_output_with_grad.square().mean().backward()
    optimizer.step()
    size = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    cfg = config.from_dict(trainer_config(train={"lora_rank": 4}))
    terms = {t.name: t.bytes for t in memory_plan.plan_for_config(cfg, shape).terms}
    assert terms["master weights"] == size(model.parameters())
    assert terms["gradients"] == size(p.grad for p in model.parameters() if p.grad is not None) == 4 * TINY_ADAPTERS
    assert terms["AdamW moments"] == size(s[k] for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
    assert terms["all-reduce buffer"] == 4 * TINY_ADAPTERS
    # The 5B recipe at rank 32 (HSDP, shard groups of 8): gradients and moments scale with the adapters.
    counts = model_shape.ParamCounts.from_shapes(model_shape.config_shapes(WAN_TI2V_5B))
    five_b = model_shape.ModelShape(dict(WAN_TI2V_5B), counts, 0, 48, 16, 4)
    adapters = lora.adapter_shapes(counts.shapes, 32, targets)
    assert sum(math.prod(s) for s in adapters.values()) == 80_609_280  # 30 blocks x 10 layers x 32 (in + out)

    def plan(rank: int) -> dict:
        data = __import__("yaml").safe_load((repo / "config/recipes/rl_5b_cps.yaml").read_text())
        data.setdefault("train", {})["lora_rank"] = rank
        data.setdefault("parallel", {})["device_memory_gib"] = 80
        recipe = config.from_dict(data, partial=True)
        return {t.name: t.bytes for t in memory_plan.plan_for_config(recipe, five_b).terms}

    full, low_rank = plan(0), plan(32)
    with torch.device("meta"):
        chunk = sum(torch.chunk(torch.empty(s), 8)[0].numel() for s in adapters.values())
        base_chunk = sum(torch.chunk(torch.empty(s), 8)[0].numel() for s in counts.shapes.values())
    assert low_rank["gradients"] == 4 * chunk and low_rank["AdamW moments"] == 8 * chunk
    # the recipe computes in bf16: the frozen base is held in bf16 (train.lora_base_dtype: compute)
    assert full["gradients"] == 4 * base_chunk and low_rank["master weights"] == 2 * base_chunk + 4 * chunk
    assert low_rank["FSDP block gradients"] * 30 == sum(math.prod(s) for s in adapters.values()) * 4  # reduce: fp32
    assert 60 * low_rank["gradients"] < full["gradients"]


def test_the_flop_count_of_a_lora_update_is_what_torch_counts(tiny_model):
    """Forward, backward without the frozen weights' gradients, and the checkpointed blocks' recompute."""
    from torch.utils.flop_counter import FlopCounterMode

    model = peft_tiny(tiny_model, 4)
    model.set_attention_backend("_native_math")  # the counter has no formula for CPU's fused attention
    model.enable_gradient_checkpointing()
    latent, text = (48, 3, 8, 8), 16
    tokens = flops.video_tokens(latent, model.config.patch_size)
    with FlopCounterMode(display=False) as counter:
        out = model(torch.randn(2, *latent), torch.rand(2, tokens), torch.randn(2, text, 32), return_dict=False)[0]
        out.square().mean().backward()
    targets = config.Config().train.lora_targets
    counted = flops.forward_flops(model.config, tokens, text, 2, lora_rank=4, lora_targets=targets)
    full = flops.forward_flops(model.config, tokens, text, 2)
    assert counted.training(True) == counter.get_total_flops()
    assert counted.total > full.total and counted.backward < full.backward  # adapters added, weight gradients gone


def test_starting_adapters_from_another_runs_weights_is_refused_naming_the_fields(repo):
    from videogrpo import config
    from videogrpo.errors import ConfigError

    base = {"train": {"lora_rank": 4, "resume_from": "/ckpt/step-00000100"}}
    with pytest.raises(ConfigError, match=r"train.resume_from .* train.reset_dataloader: true and train.lora_rank"):
        config.load([repo / "config/config.yaml"], base)
    full_state = config.deep_merge(base, {"train": {"reset_dataloader": False}})
    assert config.load([repo / "config/config.yaml"], full_state).train.lora_rank == 4


@pytest.mark.parametrize(("base_dtype", "held"), [("compute", torch.bfloat16), ("float32", torch.float32)])
def test_the_frozen_base_is_held_in_the_compute_dtype_unless_float32_is_asked(
    base_dtype, held, tiny_model, dataset, tmp_path
):
    """train.lora_base_dtype: a bf16 run holds its frozen base in bf16 (the downloaded weights rounded once, the same
    at every build and resume), the adapters in float32; one update trains the adapters and leaves the base as built.
    The memory plan counts the base in that dtype."""
    cfg = lora_config(train={"max_steps": 1, "lora_base_dtype": base_dtype}, parallel={"param_dtype": "bfloat16"})
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    module = trainer.experts.policy
    initial = adapters_of(module)
    original = load_file(tiny_model / "transformer/diffusion_pytorch_model.safetensors")
    base = base_of(module)
    assert all(base[k].dtype == held and torch.equal(base[k], original[k].to(held)) for k in original)
    assert all(v.dtype == torch.float32 for v in initial.values())
    trainer.run()
    assert all(torch.equal(base_of(module)[k], original[k].to(held)) for k in original)
    assert any(not torch.equal(v, initial[k]) for k, v in adapters_of(module).items())

    loaded = config.from_dict(cfg)
    shape = model_shape.with_lora(model_shape.ModelShape.from_model_dir(tiny_model), 4, loaded.train.lora_targets)
    plan = memory_plan.plan_for_config(loaded, model_shape.ModelShape.from_model_dir(tiny_model))
    adapters = shape.trainable
    base_numel = shape.trained - adapters
    master = next(t for t in plan.terms if t.name == "master weights")
    assert master.bytes == base_numel * held.itemsize + 4 * adapters  # one rank: nothing is sharded or padded
