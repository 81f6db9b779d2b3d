"""The Triton compiler check of the per-node preflight: a tiny kernel compiled and run on the first GPU.

Imported only by the preflight's probe process, and only where triton is installed: `@triton.jit` reads
the kernel's source from this file.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SIZE = 100  # not a power of two: the masked tail is compiled and checked too


@triton.jit
def _add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)


def run_test_kernel() -> str:
    """ "ok" when the kernel compiled (into TRITON_CACHE_DIR) and computed x + 1; else what came out."""
    x = torch.arange(SIZE, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    _add_one[(triton.cdiv(SIZE, 64),)](x, out, SIZE, BLOCK=64)
    torch.cuda.synchronize()
    if not torch.equal(out, x + 1):
        return f"wrong result: max error {(out - x - 1).abs().max().item()}"
    return "ok"
