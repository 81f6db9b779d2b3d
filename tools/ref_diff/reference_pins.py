"""The pins of the reference environment: the versions the reference's own lock file (uv.lock) names for the
packages its trainer imports, printed as pip requirements.

    python reference_pins.py REFERENCE_CHECKOUT

torch is not taken from the lock (it pins a CUDA build): the tool installs the CPU build of the project's own
torch release instead (run_all.sh, TORCH_SPEC).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

# What the reference's trainer, models and tests import (and what those need at import time), by lock name.
PACKAGES = (
    "accelerate",
    "diffusers",
    "easydict",
    "ftfy",
    "huggingface-hub",
    "imageio",
    "loguru",
    "numpy",
    "peft",
    "pillow",
    "pyarrow",
    "pydantic",
    "pytest",
    "regex",
    "rich",
    "safetensors",
    "tokenizers",
    "torchdata",
    "transformers",
    "webdataset",
)


def pins(checkout: Path) -> list[str]:
    lock = tomllib.loads((checkout / "uv.lock").read_text())
    found = {p["name"]: p["version"] for p in lock["package"]}
    missing = [name for name in PACKAGES if name not in found]
    if missing:
        raise SystemExit(f"{checkout}/uv.lock pins no {', '.join(missing)}: is this the reference checkout?")
    return [f"{name}=={found[name]}" for name in PACKAGES]


if __name__ == "__main__":
    print("\n".join(pins(Path(sys.argv[1]))))
