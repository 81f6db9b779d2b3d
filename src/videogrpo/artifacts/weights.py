"""safetensors files read by their headers only: what each tensor is and where its bytes lie, checked against the
file's size, without reading a byte of the weights.

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor name -> dtype, shape,
[begin, end) offsets into the data that follows) and the data. A file is accepted when the header parses, every
tensor's byte span is its shape times its dtype's size, and the spans end exactly where the file does: a
truncated download names the first tensor whose bytes are missing.

`read_header` is the one reader of these headers: fetch_eval_model's validation, preflight's disk-space check and
the memory plan (through `directory_numels`) all refuse a damaged file with its message.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from videogrpo.errors import VideoGRPOError

DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
FLOATING = ("F32", "BF16", "F16")
MAX_HEADER = 100 << 20
"""The largest header the format allows (100 MB)."""


class WeightsError(VideoGRPOError):
    """A safetensors file whose header is unreadable or disagrees with its size."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Every tensor of `path` by name, from its header; WeightsError names the file and the tensor at fault."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
        if length < 0 or length > min(size - 8, MAX_HEADER):
            raise WeightsError(
                f"{path}: a header of {length} bytes in a file of {size} bytes: truncated, or not a safetensors file"
            )
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise WeightsError(f"{path}: the safetensors header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: the safetensors header is not a JSON object")
    data = size - 8 - length
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            assert dtype in DTYPE_BYTES and all(isinstance(s, int) and s >= 0 for s in shape)
            assert isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
        except (KeyError, TypeError, ValueError, AssertionError):
            raise WeightsError(f"{path}: tensor {name}: malformed header entry {entry!r}") from None
        need = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != need:
            raise WeightsError(
                f"{path}: tensor {name}: shape {list(shape)} of {dtype} is {need} bytes, its offsets span {end - begin}"
            )
        tensors[name] = TensorInfo(dtype, shape, begin, end)
    if not tensors:
        raise WeightsError(f"{path}: a safetensors file without tensors")
    past = [(info.end, name) for name, info in tensors.items() if info.end > data]
    if past:
        end, name = min(past)
        raise WeightsError(
            f"{path}: truncated: tensor {name} ends at byte {8 + length + end}, the file has {size} bytes "
            f"({len(past)} tensors incomplete); download it again"
        )
    last = max(info.end for info in tensors.values())
    if last != data:
        raise WeightsError(f"{path}: {data - last} bytes after its last tensor: not the file its header describes")
    return tensors


def directory_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of the safetensors files in `directory` (a component folder, its shards together),
    from their checked headers; WeightsError for a damaged file, or for a folder without weights (counting it as
    zero parameters would pass whatever the model holds)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{directory}: no *.safetensors weights; rerun the model's download")
    return {name: info.shape for path in files for name, info in read_header(path).items()}


def directory_numels(directory: Path) -> dict[str, int]:
    """Elements of every tensor of `directory`'s safetensors files (`directory_shapes`)."""
    return {name: math.prod(shape) for name, shape in directory_shapes(directory).items()}
