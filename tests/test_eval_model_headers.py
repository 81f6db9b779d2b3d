"""fetch_eval_model's validation reads headers and shapes, never weights: a truncated shard, a tensor of another
shape, a missing index-listed shard or a config of another model is refused naming the file and the tensor, and
a pipeline with the 5B transformer's real shapes (sparse files: headers and holes) validates in seconds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from videogrpo.artifacts.weights import read_header
from videogrpo.evaluation.pipelines import ModelRefused, validate_pipeline
from videogrpo.models.shapes import WAN_TI2V_5B

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture
def no_weight_loads(monkeypatch):
    """Any load of weights fails the test: the validation must not read them."""
    import diffusers
    import safetensors
    import safetensors.torch
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a weight load during header-only validation")

    monkeypatch.setattr(diffusers.ModelMixin, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", refuse)
    monkeypatch.setattr(safetensors, "safe_open", refuse)
    monkeypatch.setattr(safetensors.torch, "load_file", refuse)
    monkeypatch.setattr(safetensors.torch, "safe_open", refuse)


@pytest.fixture
def model(tiny_model, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model, tmp_path / "pipeline"))


def test_a_complete_pipeline_validates_without_loading_a_weight(model, no_weight_loads):
    record = validate_pipeline(model, "0" * 64)
    assert record["weights_loaded"] is False
    assert record["shapes"]["transformer"] == {"tensors": 69, "dtypes": ["F32"], "shapes": "as its config implies"}
    assert set(record["shapes"]) == {"text_encoder", "transformer", "vae"}  # tokenizer, scheduler: no weights


def test_a_truncated_shard_is_refused_naming_the_file_and_its_first_incomplete_tensor(model, no_weight_loads):
    path = model / WEIGHTS
    header = read_header(path)
    last = max(header, key=lambda name: header[name].end)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4)  # the last tensor loses its last 4 bytes
    with pytest.raises(ModelRefused, match=rf"{WEIGHTS}: truncated: tensor {last} ends at byte .*1 tensors incomplete"):
        validate_pipeline(model, "0" * 64)


def test_a_tensor_of_another_shape_is_refused_naming_file_tensor_and_both_shapes(model, no_weight_loads):
    tensors = read_all(model / WEIGHTS)
    name = "blocks.1.ffn.net.0.proj.weight"
    tensors[name] = tensors[name][:-1].contiguous()  # one FFN row short
    save_file(tensors, model / WEIGHTS)
    with pytest.raises(ModelRefused, match=rf"{WEIGHTS}: tensor {name} has shape \[95, 48\], .*implies \[96, 48\]"):
        validate_pipeline(model, "0" * 64)


def test_an_index_listed_shard_that_is_missing_or_a_config_of_another_model_is_refused(model, no_weight_loads):
    # Reshard the transformer in two files with an index, as large checkpoints are published.
    tensors = dict(sorted(read_all(model / WEIGHTS).items()))
    (model / WEIGHTS).unlink()
    names = list(tensors)
    shards = {"diffusion_pytorch_model-00001-of-00002.safetensors": names[:30],
              "diffusion_pytorch_model-00002-of-00002.safetensors": names[30:]}  # fmt: skip
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, model / "transformer" / shard)
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (model / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    assert validate_pipeline(model, "0" * 64)["shapes"]["transformer"]["tensors"] == 69
    config = model / "transformer" / "config.json"
    original = config.read_text()
    config.write_text(json.dumps(dict(json.loads(original), num_layers=3)))
    with pytest.raises(ModelRefused, match=r"transformer: \d+ tensors that transformer/config.json implies are in no"):
        validate_pipeline(model, "0" * 64)
    config.write_text(json.dumps(dict(json.loads(original), num_layers=1)))
    with pytest.raises(ModelRefused, match=r"-of-00002.safetensors: tensor blocks.1.\S+ is not one that transformer/"):
        validate_pipeline(model, "0" * 64)
    config.write_text(original)
    (model / "transformer" / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelRefused, match="index.json: shard diffusion_pytorch_model-00002-of-00002.safetensors is"):
        validate_pipeline(model, "0" * 64)


def read_all(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a file, read by the test itself (the validation's loaders are refused here)."""
    import numpy as np

    header = read_header(path)
    raw = path.read_bytes()
    start = 8 + int.from_bytes(raw[:8], "little")
    assert {info.dtype for info in header.values()} == {"F32"}
    return {
        name: torch.from_numpy(
            np.frombuffer(raw[start + info.begin : start + info.end], dtype=np.float32).reshape(info.shape).copy()
        )
        for name, info in header.items()
    }


def write_sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> int:
    """A safetensors file of the given shapes whose data is a hole (no disk, no memory): the header is real."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * int(torch.Size(shape).numel())
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little") + encoded)
        f.truncate(8 + len(encoded) + offset)
    return offset


def bytes_read() -> int:
    """Bytes this process has read through read(2) and its kind so far (Linux /proc/self/io `rchar`): a count
    of work done, unlike a time, whatever the machine's load."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def test_the_5b_transformers_real_shapes_validate_from_headers_alone(model, no_weight_loads):
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in WanTransformer3DModel(**WAN_TI2V_5B).state_dict().items()}
    (model / WEIGHTS).unlink()
    size = write_sparse_safetensors(model / WEIGHTS, shapes)
    config = json.loads((model / "transformer" / "config.json").read_text())
    (model / "transformer" / "config.json").write_text(json.dumps(dict(config, **WAN_TI2V_5B)))
    assert size > 9.9e9  # 5B parameters of bf16
    read_before = bytes_read()
    record = validate_pipeline(model, "0" * 64)
    assert bytes_read() - read_before < 64 << 20  # the headers, not 10 GB of weights
    assert record["shapes"]["transformer"] == {
        "tensors": len(shapes),
        "dtypes": ["BF16"],
        "shapes": "as its config implies",
    }
    path = model / WEIGHTS
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10**9)  # an interrupted 10 GB download
    with pytest.raises(ModelRefused, match=rf"{WEIGHTS}: truncated: tensor \S+ ends at byte"):
        validate_pipeline(model, "0" * 64)
