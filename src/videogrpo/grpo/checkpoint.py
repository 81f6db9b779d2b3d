"""Training checkpoints with torch.distributed.checkpoint: complete only when the marker exists.

Layout: <root>/step-00000012/{dcp/, rng/rank-00000.pt, state.json, COMPLETE}; the DCP holds each trainable
part's weights and optimizer state (TI2V's one transformer, or both A14B experts in one save; under LoRA the
adapters only, the frozen base being the model download's). The marker is written
last and atomically by rank 0 after every rank has finished, so a crash at any point leaves either a
complete checkpoint or one that resume ignores. Checkpoints live outside Snakemake's declared
outputs, which Snakemake deletes before a rerun.

Each checkpoint records what it was trained from and with (its resume guard): the run identity, the
digests of the training inputs and the digest of every file of the trainer's math. Auto-resume
compares them with the current ones and refuses loudly, naming what changed or what one side does not
record, rather than continuing a run under other inputs or code or silently starting over. A
checkpoint also records the topology its data position means something under: a full-state
`resume_from` is refused under another one.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException

from videogrpo import atomic
from videogrpo.errors import ConfigError, VideoGRPOError, disk_full_cause
from videogrpo.parallel import process_groups
from videogrpo.provenance import code

MARKER = "COMPLETE"

# The code whose change alters what training computes: everything the trainer runs (provenance/code.py finds it
# by the import graph: sampling, loss, optimizer, parallelism, checkpoints, both rewards' scoring and judging
# included), but for what only logs (trackers, FLOP counts). Docstrings, comments and layout never count.
TRAINER = "videogrpo.grpo.trainer"
NOT_TRAINER_MATH = ("videogrpo.grpo.tracking", "videogrpo.grpo.mlflow_run", "videogrpo.grpo.flops")
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_complete(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def ignored_folders(root: Path) -> list[str]:
    """Why resume skips each checkpoint-like folder under `root`, one line each: a run that starts over while a
    `step-*` folder is there must say why, or the folder looks like lost progress."""
    if not root.is_dir():
        return []
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")):
        if not _STEP_DIR.match(path.name):
            found.append(f"{path}: not a checkpoint folder name (step-<8 digits>), ignored")
        elif not (path / MARKER).is_file():
            # The marker is written last (module docstring): its absence is a save that never finished.
            made = [name for name in ("dcp", "rng", "state.json") if (path / name).exists()]
            has = f"it holds {', '.join(made)}" if made else "it is empty"
            found.append(
                f"{path}: incomplete (no {MARKER} marker: its save was cut short by an interruption, a crash or a "
                f"full disk; {has}), ignored; the next save of that step replaces it"
            )
    return found


def trainer_math() -> dict[str, str]:
    """Code digest of every file of the trainer's math, by package-relative path (`grpo/loss.py`)."""
    return code.part_digests(code.closure((TRAINER,), leave_out=NOT_TRAINER_MATH))


def resume_guard(run_id: str, inputs: dict[str, str]) -> dict[str, Any]:
    """What a checkpoint is trained from and with: run identity, input digests, the trainer's math."""
    return {"run_id": run_id, "inputs": dict(inputs), "trainer_math": trainer_math()}


def resume_problems(saved: dict[str, Any], current: dict[str, Any], allow_code_change: bool) -> list[str]:
    """Why a checkpoint with guard `saved` must not be resumed by a run with guard `current` (empty: it may)."""
    found = []
    if "run_id" not in saved:
        found.append(f"it records no run identity (this is run {current['run_id']!r})")
    elif saved["run_id"] != current["run_id"]:
        found.append(f"it belongs to run {saved['run_id']!r}, this is run {current['run_id']!r}")
    # An input digest missing on either side is a refusal: what cannot be compared cannot be shown the same.
    old_inputs, new_inputs = saved.get("inputs", {}), current["inputs"]
    for name in sorted(set(old_inputs) | set(new_inputs)):
        if name not in old_inputs:
            found.append(f"it records no digest of input {name} (this run's: {new_inputs[name]})")
        elif name not in new_inputs:
            found.append(f"it records input {name} ({old_inputs[name]}), of which this run has no digest")
        elif old_inputs[name] != new_inputs[name]:
            found.append(f"input {name} changed: trained on {old_inputs[name]}, now {new_inputs[name]}")
    old, new = saved.get("trainer_math", {}), current["trainer_math"]
    changed = sorted(f for f in set(old) | set(new) if old.get(f) != new.get(f))
    if changed and not allow_code_change:
        found.append(
            f"the trainer's math changed since it was written ({', '.join(changed)}); set "
            f"train.resume_across_code_changes: true to resume with the new code"
        )
    return found


def topology_problems(saved: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """Why a checkpoint written under topology `saved` cannot resume its data position under `current`."""
    if not saved:
        return ["the checkpoint records no topology (written by an older trainer)"]
    found = []
    for key in sorted(set(saved) | set(current)):
        if key not in saved or key not in current:
            found.append(f"{key} recorded on one side only")
        elif saved[key] != current[key]:
            found.append(f"{key} {saved[key]!r} in the checkpoint, {current[key]!r} in this run")
    return found


def validate_export(final_dir: Path, model_dir: Path | None = None) -> dict[str, Any]:
    """Load the exported transformer as users will (Diffusers format) and check every weight is finite; a LoRA
    run's adapters (models/lora.py) are fused into the base transformer of `model_dir` as Diffusers loads them.

    Returns the validation record the train manifest keeps; raises naming the file otherwise.
    """
    from diffusers import WanTransformer3DModel

    from videogrpo.models import lora
    from videogrpo.provenance.digest import tree_digest

    folder = final_dir / "transformer"
    adapters_only = model_dir is not None and not lora.holds_full_transformer(folder) and lora.holds_adapters(folder)
    try:
        if adapters_only:
            base = WanTransformer3DModel.from_pretrained(Path(model_dir) / "transformer", torch_dtype=torch.float32)
            model = lora.fuse_adapters(base, folder)
        else:
            model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)
    except Exception as err:  # any loading failure is the finding
        raise VideoGRPOError(f"{final_dir}/transformer: the exported weights do not load ({err})") from None
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise VideoGRPOError(f"{final_dir}/transformer: non-finite weights in {bad[:5]}; the run diverged")
    return {
        "loads": True,
        "finite": True,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}),
        "tree_sha256": tree_digest(final_dir),
    }


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / "state.json").read_text())


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


Parts = dict[str, tuple[torch.nn.Module, "torch.optim.Optimizer | None"]]
"""What a checkpoint holds: per trainable transformer (one for TI2V, `high` / `low` for I2V-A14B), the module and
its optimizer (None: weights only)."""


def _parts(model, optimizer) -> Parts:
    return model if isinstance(model, dict) else {"transformer": (model, optimizer)}


def _all_finite(parts: Parts) -> bool:
    finite = all(torch.isfinite(p.detach()).all().item() for m, _ in parts.values() for p in m.parameters())
    return all(process_groups.all_gather_objects(finite))


def state_dict_options(model: torch.nn.Module):
    """None (torch's defaults) for a model trained whole; for one with frozen parameters (LoRA: the base frozen, the
    adapters trained) options that leave the frozen ones out of the checkpoint, which a resume rebuilds from the
    model download instead."""
    from torch.distributed.checkpoint import state_dict as sd

    if all(p.requires_grad for p in model.parameters()):
        return None
    return sd.StateDictOptions(ignore_frozen_params=True, strict=False)


def dcp_state(parts: Parts, with_optim: bool) -> dict[str, Any]:
    """The DCP state dict: {"model", "optim"} for one transformer (this layout predates experts), one such pair per
    expert name otherwise, so a two-expert checkpoint is one DCP save, complete only when both experts are."""
    from torch.distributed.checkpoint import state_dict as sd

    state = {}
    for name, (model, optimizer) in parts.items():
        options = state_dict_options(model)
        if with_optim and optimizer is not None:
            model_sd, optim_sd = sd.get_state_dict(model, optimizer, options=options)
            state[name] = {"model": model_sd, "optim": optim_sd}
        else:
            state[name] = {"model": sd.get_model_state_dict(model, options=options)}
    return state["transformer"] if list(state) == ["transformer"] else state


def _set_state(parts: Parts, loaded: dict[str, Any], with_optim: bool) -> None:
    from torch.distributed.checkpoint import state_dict as sd

    for name, (model, optimizer) in parts.items():
        part = loaded if list(parts) == ["transformer"] else loaded[name]
        options = state_dict_options(model)
        if with_optim and optimizer is not None:
            sd.set_state_dict(
                model, optimizer, model_state_dict=part["model"], optim_state_dict=part["optim"], options=options
            )
        else:
            sd.set_model_state_dict(model, part["model"], options=options)


def save(
    root: Path,
    step: int,
    model: torch.nn.Module | Parts,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    rank: int,
    keep: int,
    extra: dict[str, dict[str, torch.Tensor]] | None = None,
    host_files: dict[str, object] | None = None,
) -> Path:
    """Save the model(s), optimizer(s), per-rank RNG and the JSON `state`; refuse if any weight is not finite.
    `model`: one module (with `optimizer`), or Parts (then `optimizer` is None). `extra`: further named tensor
    dicts saved beside them (DiffusionNFT's old policy), each listed in state.json's `extra`. `host_files`: objects
    rank 0 alone holds (the weights rollout actors are still to roll out under), each saved as NAME.pt and listed in
    state.json's `host_files` (read back with `load_host_file`)."""
    extra = extra or {}
    import torch.distributed.checkpoint as dcp

    parts = _parts(model, optimizer)
    if not _all_finite(parts):
        raise VideoGRPOError(
            f"step {step}: the model has non-finite weights; refusing to write a checkpoint "
            f"under {root} (lower train.lr or check the rewards)"
        )
    target = step_dir(root, step)
    if rank == 0:
        if target.exists():  # an incomplete attempt at this step
            shutil.rmtree(target)
        (target / "rng").mkdir(parents=True)
    process_groups.barrier()
    try:
        dcp.save(dcp_state(parts, with_optim=True) | extra, checkpoint_id=str(target / "dcp"))
    except CheckpointException as err:  # each rank's failure, gathered: a full disk is said as one (worker.py)
        if (full := disk_full_cause(err)) is None:
            raise
        raise OSError(full.errno, full.strerror, full.filename or str(target / "dcp")) from None
    with atomic.atomic_path(target / "rng" / f"rank-{rank:05d}.pt") as tmp:
        torch.save(rng_state(), tmp)
    for name, held in (host_files or {}).items() if rank == 0 else ():
        with atomic.atomic_path(target / f"{name}.pt") as tmp:
            torch.save(held, tmp)
    process_groups.barrier()
    if rank == 0:
        listed = dict(state, parts=sorted(parts), extra=sorted(extra))
        atomic.write_json(target / "state.json", listed | ({"host_files": sorted(host_files)} if host_files else {}))
        atomic.write_text(target / MARKER, f"step {step}\n")
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    process_groups.barrier()
    return target


def load(
    path: Path,
    model: torch.nn.Module | Parts,
    optimizer: torch.optim.Optimizer | None,
    rank: int,
    restore_rng: bool = True,
    extra: dict[str, dict[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """Restore a complete checkpoint into the model(s) (and optimizers); returns its JSON state. A checkpoint
    of other parts (one transformer vs two experts, or other experts) is refused, naming both. Those of `extra`'s
    tensor dicts the checkpoint holds (its state's `extra`) are loaded in place; the caller sees which in it."""
    import torch.distributed.checkpoint as dcp

    if not (path / MARKER).is_file():
        raise VideoGRPOError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    parts = _parts(model, optimizer)
    state = read_state(path)
    saved = state.get("parts", ["transformer"])
    if sorted(parts) != saved:
        raise VideoGRPOError(
            f"{path}: holds the trainable parts {saved}, this run trains {sorted(parts)} (model.kind, train.experts or "
            "refiners.experts differ); resume a checkpoint of this run's model, or start from its weights"
        )
    with_optim = any(opt is not None for _, opt in parts.values())
    # Weights only: a checkpoint also holding optimizer state loads partially.
    loaded = dcp_state(parts, with_optim)
    held = state.get("extra", [])
    loaded.update({key: tensors for key, tensors in (extra or {}).items() if key in held})
    dcp.load(loaded, checkpoint_id=str(path / "dcp"))
    _set_state(parts, loaded, with_optim)
    rng_file = path / "rng" / f"rank-{rank:05d}.pt"
    if restore_rng and rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return state


def load_host_file(path: Path, name: str):
    """What `save` kept as `host_files[name]` in the checkpoint at `path`."""
    if name not in read_state(path).get("host_files", []):
        raise VideoGRPOError(f"{path}: holds no {name}.pt (its state.json's host_files does not list it)")
    return torch.load(path / f"{name}.pt", weights_only=True)


def check_topology(source: Path, topology: dict) -> dict:
    """A full-state resume_from continues another run's data position and per-rank state: only under the topology it
    was written with (ConfigError otherwise). Returns its state (empty for a folder without state.json)."""
    saved = read_state(source) if (source / "state.json").is_file() else {}
    if problems := topology_problems(saved.get("topology"), topology):
        raise ConfigError(
            f"train.resume_from = {str(source)!r} with train.reset_dataloader: false resumes its data position "
            f"and per-rank state, which need the topology it was written with: {'; '.join(problems)}. "
            f"Checkpoint: {json.dumps(saved.get('topology'), sort_keys=True)}; this run: "
            f"{json.dumps(topology, sort_keys=True)}. Run with the checkpoint's topology, or set "
            f"train.reset_dataloader: true to take its weights only."
        )
    return saved


def check_resumable(latest: Path, guard: dict, across_code_changes: bool) -> None:
    """The run's newest checkpoint `latest` was written by this run (resume_problems); ConfigError otherwise."""
    if problems := resume_problems(read_state(latest).get("guard", {}), guard, across_code_changes):
        raise ConfigError(
            f"{latest}: not resuming this checkpoint: " + "; ".join(problems) + f". To start the run over instead, "
            f"remove {latest.parent}."
        )
