"""Checkpoint writers for the SFT-initialisation tests (tests/test_sft_init.py, tests/sft_init_worker.py).

`write_reference` writes the reference trainer's layout as its DCP holds it (docs/reference-system.md#a14b, read from
pufanyi/vbvr-rl src/trainer/checkpoint_runtime.py): one dcp.save per expert sub-folder of
{"train_state": {step, epoch, batch_idx, <model key>: state dict, rng_cpu}, "ema": {"shadow":
{"<model key>.<param>": tensor}, "decay"}} (the "ema" entry only when the run had EMA), the optimizer and
dataloader files beside it; the legacy root is one such DCP at the top holding every model.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from diffusers import WanTransformer3DModel

from videogrpo.models.shapes import TINY_I2V_EXPERT

REFERENCE_SUBDIRS = {"transformer": "high", "transformer_2": "low"}


def tiny_expert(seed: int, **overrides) -> WanTransformer3DModel:
    """The tiny I2V expert, every tensor perturbed so that no two seeds share a value (norms of 1 would)."""
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**{**TINY_I2V_EXPERT, **overrides}).float()
    with torch.no_grad():
        for t in model.state_dict().values():
            t.add_(0.1 * torch.randn_like(t))
    return model


def cloned(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def shifted(sd: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    return {k: v + by for k, v in sd.items()}


def _dcp(folder: Path, train: dict[str, dict], ema: dict[str, dict] | None) -> None:
    state = {"train_state": {"step": 700, "epoch": 1, "batch_idx": 12, **train, "rng_cpu": torch.get_rng_state()}}
    if ema is not None:
        state["ema"] = {"shadow": {f"{key}.{p}": t for key, sd in ema.items() for p, t in sd.items()}, "decay": 0.999}
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    for key in train:
        torch.save({"state": {}, "param_groups": []}, folder / f"optimizer_{key}_rank0.pt")
    torch.save({"position": 12}, folder / "dataloader_rank0.pt")


def write_reference(path: Path, train: dict[str, dict], ema: dict[str, dict] | None = None) -> Path:
    """The per-expert layout: `train` / `ema` map the reference's model key (transformer, transformer_2) to a
    state dict; each model goes to its own sub-folder."""
    for key, sd in train.items():
        own_ema = None if ema is None or key not in ema else {key: ema[key]}
        _dcp(path / REFERENCE_SUBDIRS[key], {key: sd}, own_ema)
    return path


def write_reference_root(path: Path, train: dict[str, dict], ema: dict[str, dict] | None = None) -> Path:
    """The legacy layout: one DCP at `path` holding every model."""
    _dcp(path, train, ema)
    return path


def write_own_experts(path: Path, experts: dict[str, dict]) -> Path:
    """This project's checkpoint of the two-expert model as checkpoint.save lays it out: {"high": {"model": sd,
    "optim": ...}, "low": ...} in step-N/dcp (test_a14b_trainer checks the trainer's own against it)."""
    dcp.save(
        {name: {"model": sd, "optim": {}} for name, sd in experts.items()},
        checkpoint_id=str(path / "dcp"),
        no_dist=True,
    )
    (path / "state.json").write_text("{}")
    (path / "COMPLETE").write_text("step 1\n")
    return path
