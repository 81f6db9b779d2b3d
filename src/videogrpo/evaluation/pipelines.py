"""Validation of a Diffusers pipeline directory before it is evaluated (docs/reference-system.md#evaluation).

A pipeline is accepted when model_index.json names components that are all present, every safetensors
file has a readable header that agrees with the file's size and whose tensors match its index, every
weighted component's tensors have the shapes its config implies, a custom pipeline.py (the published
checkpoints ship one) has exactly the pinned SHA-256, and the tokenizer and scheduler load. Weights are
read only with `load` (validate_pipeline).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from videogrpo.artifacts.weights import FLOATING, TensorInfo, WeightsError, read_header
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


def check_safetensors(root: Path) -> dict[str, dict[str, TensorInfo]]:
    """Every safetensors file's tensors, read from its header (weights.read_header: sizes and offsets checked
    against the file), and every index's weight map matched: each listed shard present and holding exactly its
    listed tensors."""
    headers: dict[str, dict[str, TensorInfo]] = {}
    for path in sorted(root.rglob("*.safetensors")):
        try:
            headers[str(path.relative_to(root))] = read_header(path)
        except WeightsError as err:  # a truncated or corrupt file is the finding
            raise ModelRefused(str(err)) from None
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
            keys = set(headers[str(shard_path.relative_to(root.resolve()))])
            listed = {k for k, v in weight_map.items() if v == shard}
            if keys != listed:
                raise ModelRefused(
                    f"{index}: shard {shard} holds {len(keys)} tensors, the index lists {len(listed)} "
                    f"(missing {sorted(listed - keys)[:3]}, extra {sorted(keys - listed)[:3]})"
                )
    if not headers:
        raise ModelRefused(f"{root}: no safetensors weights")
    return headers


SHAPE_CHECKED = ("diffusers", "transformers")
"""Libraries whose component classes are built from their config to learn the tensor shapes it implies (a
component of other code is not imported: its headers are checked, its shapes are not)."""


def expected_tensors(
    component: Path, library: str, class_name: str
) -> tuple[list[tuple[list[str], tuple[int, ...]]], list[str]]:
    """The tensors the component's config.json implies, as (names, shape): its class built on the meta device (no
    memory, no weights); a parameter tied under several names (UMT5's shared embedding) is one entry. Also the
    patterns of saved tensors the class itself ignores when loading."""
    import importlib

    import torch

    cls = getattr(importlib.import_module(library), class_name)
    with torch.device("meta"):
        if library == "diffusers":
            model = cls.from_config(cls.load_config(component))
        else:
            from transformers import AutoConfig

            model = cls(AutoConfig.from_pretrained(component))
    groups: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(tensor), ([], tuple(tensor.shape)))[0].append(name)
    persistent = set(model.state_dict())
    for name, tensor in model.named_buffers(remove_duplicate=False):
        if name in persistent:
            groups.setdefault(id(tensor), ([], tuple(tensor.shape)))[0].append(name)
    return list(groups.values()), list(getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or [])


def check_shapes(root: Path, headers: dict[str, dict[str, TensorInfo]]) -> dict[str, dict]:
    """Each weighted component's headers against its config: every tensor the config implies present with the
    shape it implies, none it does not, floating-point dtypes. Nothing is loaded."""
    spec = json.loads((root / "model_index.json").read_text())
    record: dict[str, dict] = {}
    for name in check_components(root):
        files = {rel: tensors for rel, tensors in headers.items() if Path(rel).parts[0] == name}
        if not files:
            continue  # a tokenizer, a scheduler: no weights
        found = {tensor: (rel, info) for rel, tensors in files.items() for tensor, info in tensors.items()}
        dtypes = sorted({info.dtype for _, info in found.values()})
        if odd := [t for t, (_, info) in found.items() if info.dtype not in FLOATING]:
            rel, info = found[odd[0]]
            raise ModelRefused(f"{root / rel}: tensor {odd[0]} is {info.dtype}; weights must be one of {FLOATING}")
        library, class_name = spec[name]
        if library not in SHAPE_CHECKED:
            record[name] = {"tensors": len(found), "dtypes": dtypes, "shapes": f"not checked ({library})"}
            continue
        if not (root / name / "config.json").is_file():
            raise ModelRefused(f"{root / name}: weights without a config.json")
        try:
            expected, ignored = expected_tensors(root / name, library, class_name)
        except Exception as err:  # a config its class refuses is the finding
            raise ModelRefused(f"{root / name}/config.json: {class_name} cannot be built from it ({err})") from None
        implied = {alias for names, _ in expected for alias in names}
        extra = sorted(t for t in set(found) - implied if not any(re.search(p, t) for p in ignored))
        if extra:
            rel, _ = found[extra[0]]
            raise ModelRefused(
                f"{root / rel}: tensor {extra[0]} is not one that {name}/config.json implies "
                f"({len(extra)} such tensors): the weights and the config are of different models"
            )
        missing = []
        for names, shape in expected:
            present = [alias for alias in names if alias in found]
            if not present:
                missing.append(names[0])
                continue
            for alias in present:
                rel, info = found[alias]
                if info.shape != shape:
                    raise ModelRefused(
                        f"{root / rel}: tensor {alias} has shape {list(info.shape)}, {name}/config.json implies "
                        f"{list(shape)}"
                    )
        if missing:
            raise ModelRefused(
                f"{root / name}: {len(missing)} tensors that {name}/config.json implies are in no safetensors "
                f"file, e.g. {missing[:3]}"
            )
        record[name] = {"tensors": len(found), "dtypes": dtypes, "shapes": "as its config implies"}
    return record


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


def load_light_components(root: Path) -> None:
    """Load in full what is cheap to: the tokenizer and the scheduler's config (neither has weights)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import AutoTokenizer

    for name, load in (
        ("tokenizer", AutoTokenizer.from_pretrained),
        ("scheduler", FlowMatchEulerDiscreteScheduler.load_config),
    ):
        if (root / name).is_dir():
            try:
                load(root / name)
            except Exception as err:  # which component failed is in the message
                raise ModelRefused(f"{root / name}: does not load ({type(err).__name__}: {err})") from None


def load_components(root: Path) -> None:
    """Load tokenizer, text encoder, VAE and transformer(s) as generation will (CPU, float32): every weight; an
    I2V pipeline (model_index.json's WanImageToVideoPipeline) as WanI2VA14B, both experts."""
    import torch

    from videogrpo.models.i2v import WanI2VA14B
    from videogrpo.models.wan import WanTI2V

    i2v = json.loads((root / "model_index.json").read_text()).get("_class_name") == "WanImageToVideoPipeline"
    try:
        (WanI2VA14B if i2v else WanTI2V)(root, torch.device("cpu"))
    except Exception as err:  # which component failed is in the message
        raise ModelRefused(f"{root}: a component does not load ({type(err).__name__}: {err})") from None


def validate_pipeline(root: Path, pinned_pipeline_sha256: str, load: bool = False) -> dict:
    """The validation record of a pipeline directory, or ModelRefused naming the file (and the tensor).

    Without `load` (what fetch_eval_model runs on the login node) no weight is read: headers, sizes, index
    shards, dtypes and the shapes each component's config implies, plus a full load of the weightless
    tokenizer and scheduler; a 5B pipeline validates in seconds. `load` also loads every component as
    generation will (the tiny model's tests; a cluster job, for a pipeline whose weights must be proven to load).
    """
    record = {
        "pipeline_sha256": check_pipeline_source(root, pinned_pipeline_sha256),
        "components": check_components(root),
    }
    headers = check_safetensors(root)
    record["safetensors"] = {rel: len(tensors) for rel, tensors in headers.items()}
    record["shapes"] = check_shapes(root, headers)
    load_light_components(root)
    if load:
        load_components(root)
    record["weights_loaded"] = load
    return record
