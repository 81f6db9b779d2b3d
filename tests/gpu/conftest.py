"""The GPU tier: every test here needs CUDA and is skipped without it (CI has none).

Run on a GPU node from the GPU environment: `pytest tests/gpu -q`, or `bash bench/gpu_smoke.sh`.
"""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the GPU tier: bash bench/gpu_smoke.sh on a GPU node)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
