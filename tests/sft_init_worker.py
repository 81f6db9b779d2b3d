"""One rank of the sharded SFT-initialisation check (run by tests/test_sft_init.py under torchrun, gloo, 2 ranks).

argv: the reference per-expert checkpoint the test wrote, the tensors it holds (expected.pt: the EMA copy of
`transformer`, the training state of `transformer_2`), an output folder shared by the ranks.
1. The high expert FSDP2-sharded over both ranks and the low expert TP2-split, both initialised from the
   reference checkpoint, compared gathered with what it holds.
2. An FSDP2-sharded one-transformer model saved with this project's checkpoint.save, read back with
   load_initial_weights into a TP2-split one (another sharding than it was written with).
Each rank writes its measurements to <out>/rank<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from sft_ckpt import cloned, tiny_expert
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh

from videogrpo.grpo import checkpoint, sft_init
from videogrpo.parallel import fsdp, process_groups, tensor_parallel


def gathered(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # on every rank


def largest_difference(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> float:
    full = gathered(model)
    assert set(full) == set(expected), sorted(set(full) ^ set(expected))
    return max(float((full[k].float() - expected[k].float()).abs().max()) for k in expected)


def main() -> None:
    source, expected_file, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ctx = process_groups.init("cpu", "gloo", 1)
    expected = torch.load(expected_file)
    dp_mesh = init_device_mesh("cpu", (ctx.world_size,))
    tp_mesh = tensor_parallel.device_mesh(tensor_parallel.MeshDims(ctx.world_size, 2), "cpu", "gloo")["tp"]

    high = fsdp.fully_shard_model(tiny_expert(11), dp_mesh, torch.float32, torch.float32)
    low = tensor_parallel.apply_tensor_parallel(tiny_expert(12), tp_mesh)
    lines = []
    report = sft_init.load_initial_weights(source, {"high": high, "low": low}, log=lines.append)
    result = {
        "rank": ctx.rank,
        "summary": report.summary(),
        "sources": {n: e.source for n, e in report.experts.items()},
        "high_sharded": fsdp.is_sharded(high),
        "low_dtensors": sum(hasattr(p, "full_tensor") for p in low.parameters()),
        "high_diff": largest_difference(high, expected["transformer"]),
        "low_diff": largest_difference(low, expected["transformer_2"]),
        "warnings": lines,
    }

    written = fsdp.fully_shard_model(tiny_expert(13), dp_mesh, torch.float32, torch.float32)
    optimizer = torch.optim.AdamW(written.parameters(), lr=1e-3)
    own = checkpoint.save(out / "own", 3, written, optimizer, {"update": 3}, rank=ctx.rank, keep=1)
    want = gathered(written)
    fresh = tensor_parallel.apply_tensor_parallel(tiny_expert(14), tp_mesh)
    before = largest_difference(fresh, want)
    own_report = sft_init.load_initial_weights(own, {"transformer": fresh}, log=lines.append)
    result.update(
        own_layout=own_report.layout,
        own_before=before,
        own_diff=largest_difference(fresh, want),
        own_loaded=own_report.experts["transformer"].loaded,
        own_tensors=len(cloned(tiny_expert(0))),
    )
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(result))
    process_groups.shutdown()


if __name__ == "__main__":
    main()
