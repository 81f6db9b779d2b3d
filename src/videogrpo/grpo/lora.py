"""LoRA training (train.lora_rank > 0, docs/options.md#lora): peft adapters on each trained transformer, the base
frozen, only the adapters trained, checkpointed and exported.

The adapters are added before any sharding, the way Diffusers' training scripts add them
(`transformer.add_adapter(LoraConfig(...))`), so their keys are Diffusers' LoRA keys. They are float32 like every
master weight; the frozen base is cast to train.lora_base_dtype (the compute dtype by default, so a bf16 run holds
the base in bf16, or float32 as downloaded), and the compute dtype is applied per forward as for full fine-tuning. Their
initialisation (peft's default: A Kaiming-uniform, B zero, so the first forward is the base model's) draws from a
generator seeded by train.seed and the expert's position, inside a fork of torch's RNG: every rank and every resume
builds the same adapters, and the run's own random stream is left as it was. Only the adapters require gradients, so
AdamW, clipping and the gradient reduction (FSDP's reduce-scatter or the all-reduce) see only them; FSDP2 shards
the frozen base and the adapters of a block together. Checkpoints hold the adapters and their AdamW state only
(grpo/checkpoint.py leaves frozen parameters out); a resume rebuilds the base from the model download.

The export writes each trained transformer's adapters as `WanPipeline.save_lora_weights` does (models/lora.py says
where), and with train.lora_export_merged the transformer with them merged in as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from videogrpo.config import Config
from videogrpo.errors import ConfigError
from videogrpo.grpo.draws import counter_seed
from videogrpo.models.lora import ADAPTERS_FILE

SEED_TAG = 0x10A4
"""The key slot of the adapters' initialisation (training's other draws use others)."""
ADAPTER = "default"
"""peft's adapter name, as `add_adapter` names it by default."""


def enabled(cfg: Config) -> bool:
    return cfg.train.lora_rank > 0


def lora_config(cfg: Config):
    from peft import LoraConfig

    t = cfg.train
    return LoraConfig(
        r=t.lora_rank,
        lora_alpha=t.lora_alpha if t.lora_alpha is not None else t.lora_rank,
        lora_dropout=t.lora_dropout,
        target_modules=list(t.lora_targets),
        init_lora_weights=True,
    )


def is_adapter(name: str) -> bool:
    """Whether a parameter name (peft's keys: `...to_q.lora_A.default.weight`) is an adapter's."""
    return ".lora_A." in name or ".lora_B." in name


def matches(module_name: str, target: str) -> bool:
    """peft's target_modules rule for a list of names: the module's name is the target or ends with `.target`."""
    return module_name == target or module_name.endswith("." + target)


def add_adapters(module: torch.nn.Module, cfg: Config, index: int) -> None:
    """Add the run's LoRA adapters to the raw transformer `module` (expert number `index`) and freeze its base."""
    linears = [name for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    unmatched = [t for t in cfg.train.lora_targets if not any(matches(name, t) for name in linears)]
    if unmatched:
        raise ConfigError(
            f"train.lora_targets = {list(cfg.train.lora_targets)}: {unmatched} name no linear layer of the "
            f"transformer (e.g. {linears[:4]}); use suffixes of its linear layers' names"
        )
    # peft initialises on the CPU and moves the adapters to the base layer's device: fork both streams.
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(counter_seed(cfg.train.seed, SEED_TAG, index))
        module.add_adapter(lora_config(cfg))
    base = getattr(torch, cfg.lora_base_dtype)
    for name, param in module.named_parameters():
        param.requires_grad_(is_adapter(name))
        if not is_adapter(name) and param.dtype != base:  # frozen: no master copy needed beyond the compute dtype
            param.data = param.data.to(base)
    wrong = sorted({str(p.dtype) for n, p in module.named_parameters() if is_adapter(n) and p.dtype != torch.float32})
    if wrong:
        raise RuntimeError(f"LoRA adapters in {wrong}, not float32: the master weights must be float32")


def trainable_numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def adapter_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters of a wrapped transformer gathered on CPU, in Diffusers' LoRA keys (peft's without the adapter
    name). Collective under FSDP: every rank calls it."""
    from peft.utils import get_peft_model_state_dict

    from videogrpo.parallel import fsdp

    gathered = fsdp.trained_state_dict(module)  # the adapters: the only parameters that train
    return get_peft_model_state_dict(module, state_dict=gathered, adapter_name=ADAPTER)


def gather_export(experts, cfg: Config) -> dict[str, tuple[dict, dict | None]]:
    """Per expert: its adapters (Diffusers keys) and, with train.lora_export_merged, every parameter (peft keys) to
    merge. Collective: every rank calls it."""
    out = {}
    for expert in experts.experts:
        adapters = adapter_state_dict(expert.module)
        whole = None
        if cfg.train.lora_export_merged:
            from videogrpo.parallel import fsdp

            whole = fsdp.full_state_dict(expert.module)
        out[expert.name] = (adapters, whole)
    return out


def write_export(folder: Path, config, adapters: dict, whole: dict | None, cfg: Config) -> None:
    """Write one trained transformer's export into `folder`: its adapters as `WanPipeline.save_lora_weights` writes
    them, and the merged transformer when `whole` (every parameter, peft keys) is given."""
    from diffusers import WanPipeline, WanTransformer3DModel

    metadata = lora_config(cfg).to_dict()
    metadata["target_modules"] = sorted(metadata["target_modules"])  # a set in peft: JSON needs a list
    WanPipeline.save_lora_weights(
        str(folder), transformer_lora_layers=adapters, transformer_lora_adapter_metadata=metadata
    )
    canonical_header(folder / ADAPTERS_FILE)
    if whole is None:
        return
    plain = WanTransformer3DModel.from_config(config)
    with torch.random.fork_rng(devices=[]):  # the initial adapters are overwritten: draw nothing from the run
        plain.add_adapter(lora_config(cfg))
    plain.load_state_dict(whole)
    plain.fuse_lora()
    plain.unload_lora()
    plain.save_pretrained(str(folder))


def canonical_header(path: Path) -> None:
    """Rewrite a safetensors file's JSON header with sorted keys. safetensors writes its metadata map in hash
    order, so two identical runs wrote different bytes (and digests) for the same adapters; the tensor data and
    what any reader sees are unchanged."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the header length stays a multiple of 8, as safetensors aligns it
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size :])


def adapter_shapes(shapes: dict[str, tuple[int, ...]], rank: int, targets) -> dict[str, tuple[int, ...]]:
    """The adapters' parameter shapes peft adds to a transformer whose parameter shapes are `shapes` (state-dict
    keys): for each linear weight [out, in] of a targeted layer, lora_A [rank, in] and lora_B [out, rank]. Torch-free:
    the memory plan counts with it."""
    found = {}
    for name, shape in shapes.items():
        layer, _, leaf = name.rpartition(".")
        if leaf == "weight" and len(shape) == 2 and any(matches(layer, t) for t in targets):
            out_features, in_features = shape
            found[f"{layer}.lora_A.{ADAPTER}.weight"] = (rank, in_features)
            found[f"{layer}.lora_B.{ADAPTER}.weight"] = (out_features, rank)
    return found
