"""Validation of a Diffusers pipeline directory before it is evaluated (REFERENCE section 10).

A pipeline is accepted when model_index.json names components that are all present, every safetensors
file has a readable header whose tensors match its index, a custom pipeline.py (the published
checkpoints ship one) has exactly the pinned SHA-256, and every component loads.
"""

from __future__ import annotations

import json
from pathlib import Path

from videogrpo.errors import VideoGRPOError
from videogrpo.provenance.digest import sha256_file


class ModelRefused(VideoGRPOError):
    """A pipeline directory that must not be evaluated."""


def parse_hub_model(name: str, spec: str) -> tuple[str, str]:
    """`repo_id@revision` of matrix.hub_models[name]."""
    repo_id, sep, revision = spec.partition("@")
    if not sep or not repo_id or not revision:
        raise VideoGRPOError(f"matrix.hub_models.{name} = {spec!r}: write it as repo_id@<40-hex revision>")
    return repo_id, revision


def check_pipeline_source(root: Path, pinned: str) -> str | None:
    """The SHA-256 of root/pipeline.py (None without one); refused unless it is the pinned one."""
    path = root / "pipeline.py"
    if not path.is_file():
        return None
    actual = sha256_file(path)
    if actual != pinned:
        raise ModelRefused(
            f"{path}: custom pipeline code with SHA-256 {actual}, but matrix.pipeline_sha256 pins {pinned}; "
            f"refusing to evaluate a pipeline whose code was not reviewed"
        )
    return actual


def check_safetensors(root: Path) -> dict[str, int]:
    """Tensors per safetensors file, every header read and every index's weight map matched."""
    from safetensors import safe_open

    counts: dict[str, int] = {}
    for path in sorted(root.rglob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                keys = set(f.keys())
        except Exception as err:  # a truncated or corrupt header is the finding
            raise ModelRefused(f"{path}: not a readable safetensors file ({err})") from None
        if not keys:
            raise ModelRefused(f"{path}: a safetensors file without tensors")
        counts[str(path.relative_to(root))] = len(keys)
    for index in sorted(root.rglob("*.safetensors.index.json")):
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        if not weight_map:
            raise ModelRefused(f"{index}: empty weight_map")
        for shard in sorted(set(weight_map.values())):
            shard_path = (index.parent / shard).resolve()
            if root.resolve() not in shard_path.parents:
                raise ModelRefused(f"{index}: shard {shard} lies outside the model directory")
            if not shard_path.is_file():
                raise ModelRefused(f"{index}: shard {shard} is missing")
            with safe_open(str(shard_path), framework="pt") as f:
                keys = set(f.keys())
            listed = {k for k, v in weight_map.items() if v == shard}
            if keys != listed:
                raise ModelRefused(
                    f"{index}: shard {shard} holds {len(keys)} tensors, the index lists {len(listed)} "
                    f"(missing {sorted(listed - keys)[:3]}, extra {sorted(keys - listed)[:3]})"
                )
    if not counts:
        raise ModelRefused(f"{root}: no safetensors weights")
    return counts


def check_components(root: Path) -> list[str]:
    """The components model_index.json names, each present as a directory."""
    index = root / "model_index.json"
    if not index.is_file():
        raise ModelRefused(f"{root}: no model_index.json; not a Diffusers pipeline directory")
    spec = json.loads(index.read_text())
    components = sorted(
        name
        for name, value in spec.items()
        if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and value != [None, None]
    )
    missing = [name for name in components if not (root / name).is_dir()]
    if missing:
        raise ModelRefused(f"{root}: model_index.json names components without a directory: {missing}")
    return components


def load_components(root: Path) -> None:
    """Load tokenizer, text encoder, VAE and transformer as generation will (CPU, float32)."""
    import torch

    from videogrpo.models.wan import WanTI2V

    try:
        WanTI2V(root, torch.device("cpu"))
    except Exception as err:  # which component failed is in the message
        raise ModelRefused(f"{root}: a component does not load ({type(err).__name__}: {err})") from None


def validate_pipeline(root: Path, pinned_pipeline_sha256: str, load: bool = True) -> dict:
    """The validation record of a pipeline directory, or ModelRefused naming the file."""
    record = {
        "pipeline_sha256": check_pipeline_source(root, pinned_pipeline_sha256),
        "components": check_components(root),
        "safetensors": check_safetensors(root),
    }
    if load:
        load_components(root)
        record["loads"] = True
    return record
