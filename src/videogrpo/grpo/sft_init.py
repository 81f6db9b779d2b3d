"""Weight-only initialisation from a checkpoint (`train.resume_from` with `reset_dataloader: true`).

A pure reader: it detects the checkpoint's layout, picks per expert the tensors to take, checks every shape
against the module before reading a byte, and loads with torch.distributed.checkpoint into the module as it
is (plain, FSDP2- or TP-sharded: DCP reads each rank's own shards). Counters, optimizers, the data position
and RNG are the caller's and start fresh. Collective when a process group exists: every rank calls it with
the same path and the same experts, in the same order.

Layouts, tried in this order on the resume_from path P:

- `videogrpo`: this project's checkpoint, P = <run>/checkpoints/step-N with COMPLETE and dcp/ (one DCP
  whose "model" entry holds the weights: `model.<param>` for the one-transformer TI2V model,
  `high.model.<param>` / `low.model.<param>` for the two experts, as checkpoint.save writes them). Weights
  only; its optimizers are ignored.
- `reference_experts`: the reference trainer's checkpoint-N/ with a DCP per expert, `high/` (key
  `transformer`) and `low/` (key `transformer_2`). The one-transformer TI2V model reads `high/`, where the
  reference writes its `transformer`.
- `reference_root`: the reference's legacy layout, one DCP at P holding every model under its own key.

In a reference DCP a model's training state is `train_state.<key>.<param>` and its EMA copy, present only
when that run had EMA on (ema_decay > 0), `ema.shadow.<key>.<param>`. Per expert the EMA copy is taken when
the DCP holds any EMA tensor of that model, else the training state. The reference's EMA tracks only
parameters that require grad, so a tensor the EMA lacks (a frozen parameter, a persistent buffer) is taken
from the training state of the same DCP (the reference leaves it at the base model's value instead; for a
full fine-tune both hold the same tensors).

Decided here, stricter than the reference (which silently keeps the base model's weights for whatever a
checkpoint lacks): a legacy root read into two experts must hold both `transformer` and `transformer_2`
(never one copied into the other); a missing `high/` or `low/` for a loaded expert, or a module tensor the
checkpoint does not hold, is an error. As in the reference, a checkpoint tensor the module has no
counterpart for is dropped with a warning, and a shape mismatch is an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from videogrpo.errors import ConfigError
from videogrpo.grpo.tracking import log as log_line

MARKER = "COMPLETE"  # videogrpo.grpo.checkpoint.MARKER; not imported, so this reader never loads the trainer's math
REFERENCE_FOLDERS = {"high": "high", "low": "low", "transformer": "high"}
"""The reference's sub-folder per expert name (`transformer`: the one-transformer model, written to high/)."""
REFERENCE_KEYS = {"high": "transformer", "low": "transformer_2", "transformer": "transformer"}
"""The reference's model key per expert name, in its train_state and EMA entries."""
OWN_PREFIXES = {"high": "high.model.", "low": "low.model.", "transformer": "model."}
"""Where this project's checkpoints keep each expert's weights in their DCP."""
SHOWN = 5  # names quoted in a message before "and N more"


@dataclass(frozen=True)
class ExpertInit:
    """What one expert was initialised from."""

    folder: Path
    """The DCP directory read."""
    source: str
    """`ema` (the checkpoint's EMA copy) or `training` (its training state)."""
    loaded: int
    """Tensors loaded into the module."""
    from_training: int
    """Of those, taken from the training state because the EMA copy lacks them (0 unless source is ema)."""
    dropped: tuple[str, ...]
    """Checkpoint tensors of this expert with no counterpart in the module (warned, not loaded)."""
    dtypes: tuple[str, ...]
    """The dtypes the loaded tensors have in the checkpoint (each is cast to its module tensor's dtype)."""


@dataclass(frozen=True)
class InitReport:
    """The layout found and, per expert name, what was loaded."""

    path: Path
    layout: str
    experts: dict[str, ExpertInit]

    def summary(self) -> str:
        parts = []
        for name, e in self.experts.items():
            filled = f", {e.from_training} of them from the training state" if e.from_training else ""
            parts.append(
                f"{name}: {e.source} weights from {e.folder} ({e.loaded} {'/'.join(e.dtypes)} tensors{filled}; "
                f"{len(e.dropped)} dropped)"
            )
        return f"initialised weights from {self.path} (layout {self.layout}): " + "; ".join(parts)


def detect_layout(path: Path) -> str:
    """`videogrpo`, `reference_experts` or `reference_root`; a ConfigError naming what was looked for."""
    if (path / "dcp" / ".metadata").is_file():
        if not (path / MARKER).is_file():
            raise ConfigError(
                f"train.resume_from = {str(path)!r}: a checkpoint of this project without its {MARKER} marker "
                f"(its writing was interrupted); name a complete step-N directory instead"
            )
        return "videogrpo"
    if any((path / sub / ".metadata").is_file() for sub in ("high", "low")):
        return "reference_experts"
    if (path / ".metadata").is_file():
        return "reference_root"
    raise ConfigError(
        f"train.resume_from = {str(path)!r} is not a checkpoint: looked for {path}/{MARKER} with "
        f"{path}/dcp/.metadata (this project's step-N), {path}/high/.metadata or {path}/low/.metadata (the "
        f"reference's per-expert layout) and {path}/.metadata (the reference's legacy root); "
        f"{'the path does not exist' if not path.exists() else 'none is there'}. Name a checkpoint directory."
    )


def _folder(path: Path, layout: str, name: str) -> Path:
    if layout == "videogrpo":
        return path / "dcp"
    if layout == "reference_root":
        return path
    folder = path / REFERENCE_FOLDERS[name]
    if not (folder / ".metadata").is_file():
        present = [sub for sub in ("high", "low") if (path / sub / ".metadata").is_file()]
        raise ConfigError(
            f"train.resume_from = {str(path)!r}: expert {name!r} needs {folder}/.metadata (the reference's "
            f"{REFERENCE_FOLDERS[name]}/ sub-folder), but the checkpoint holds only {', '.join(present)}/; "
            f"name a checkpoint holding every loaded expert, or load only the experts it has (train.experts)"
        )
    return folder


def _sources(layout: str, name: str) -> list[tuple[str, str]]:
    """(source, key prefix) in order of preference."""
    if layout == "videogrpo":
        return [("training", OWN_PREFIXES[name])]
    key = REFERENCE_KEYS[name]
    return [("ema", f"ema.shadow.{key}."), ("training", f"train_state.{key}.")]


def _under(metadata: dict, prefix: str) -> dict[str, object]:
    """Checkpoint entries under `prefix`, by their name inside it."""
    return {key[len(prefix) :]: meta for key, meta in metadata.items() if key.startswith(prefix)}


def _names(keys) -> str:
    keys = sorted(keys)
    more = len(keys) - SHOWN
    return ", ".join(keys[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def _plan(folder: Path, layout: str, name: str, model_sd: dict, log: Callable[[str], None]):
    """Per module tensor the checkpoint key to read, the source, the count filled from training, dropped keys."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    sources = _sources(layout, name)
    found = [(source, prefix, _under(metadata, prefix)) for source, prefix in sources]
    found = [f for f in found if f[2]]
    if not found:
        looked = " or ".join(f"{prefix}*" for _, prefix in sources)
        groups = sorted({".".join(k.split(".")[: 3 if k.startswith("ema.shadow.") else 2]) for k in metadata})
        raise ConfigError(
            f"{folder}/.metadata holds no weights of expert {name!r}: looked for {looked}; it holds "
            f"{_names(groups)}. Name a checkpoint of this model (train.resume_from)"
        )
    source = found[0][0]
    plan: dict[str, str] = {}
    dtypes = set()
    filled = 0
    mismatches = []
    for param, tensor in model_sd.items():
        for i, (_, prefix, entries) in enumerate(found):
            if param in entries:
                meta = entries[param]
                is_tensor = isinstance(meta, TensorStorageMetadata)
                shape = tuple(meta.size) if is_tensor else "not a tensor"
                if shape != tuple(tensor.shape):
                    mismatches.append((prefix + param, shape, tuple(tensor.shape)))
                else:
                    dtypes.add(str(meta.properties.dtype).removeprefix("torch."))
                plan[param] = prefix + param
                filled += i > 0
                break
    if mismatches:
        key, saved, wanted = mismatches[0]
        others_n = f" (and {len(mismatches) - 1} more mismatches)" if len(mismatches) > 1 else ""
        raise ConfigError(
            f"{folder}/.metadata: {key} has shape {saved} in the checkpoint but {wanted} in expert {name!r}"
            f"{others_n}; the checkpoint is of another model configuration: set model.path to the model "
            f"it was trained from, or name a checkpoint of this model (train.resume_from)"
        )
    missing = [p for p in model_sd if p not in plan]
    if missing:
        raise ConfigError(
            f"{folder}/.metadata lacks {len(missing)} of the {len(model_sd)} tensors of expert {name!r} "
            f"({_names(missing)}; looked under {' and '.join(prefix for _, prefix, _ in found)}); a partial "
            f"initialisation would keep the base model's values for them. Name a checkpoint of this model"
        )
    unknown = set().union(*(entries for _, _, entries in found)) - set(model_sd)
    if unknown:
        log(
            f"warning: {folder}: {len(unknown)} checkpoint tensors of expert {name!r} have no counterpart in "
            f"the model and are dropped: {_names(unknown)}"
        )
    return plan, source, filled, tuple(sorted(unknown)), tuple(sorted(dtypes))


def load_initial_weights(
    path: str | Path, experts: Mapping[str, torch.nn.Module], log: Callable[[str], None] = log_line
) -> InitReport:
    """Load each expert's weights from the checkpoint at `path` (layouts: module docstring).

    `experts`: expert name (`high`, `low`, or `transformer` for the one-transformer model) -> module, plain
    or sharded. `log` receives warnings (pass the trainer's rank-0 logger). Every check runs on every expert
    before any module changes, so a refusal leaves all of them as they were.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    path = Path(path)
    for name in experts:
        if name not in REFERENCE_KEYS:
            raise ValueError(f"expert name {name!r}: use one of {sorted(REFERENCE_KEYS)}")
    if "transformer" in experts and len(experts) > 1:
        raise ValueError("expert `transformer` is the one-transformer model: pass it alone")
    layout = detect_layout(path)
    plans = {}
    for name, module in experts.items():
        folder = _folder(path, layout, name)
        model_sd = get_model_state_dict(module)
        plans[name] = (folder, model_sd, *_plan(folder, layout, name, model_sd, log))
    report = {}
    for name, (folder, model_sd, plan, source, filled, dropped, dtypes) in plans.items():
        target = {plan[param]: tensor for param, tensor in model_sd.items()}
        with warnings.catch_warnings():
            # Without a process group DCP reads in this process alone, as meant, and warns that it does.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(target, checkpoint_id=str(folder))
        set_model_state_dict(experts[name], {param: target[plan[param]] for param in model_sd})
        report[name] = ExpertInit(folder, source, len(plan), filled, dropped, dtypes)
    return InitReport(path, layout, report)
