"""Every process group a run's collectives use waits as long as the reference's (240 minutes), the mesh's too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = """
import json, torch, torch.distributed as dist
from videogrpo.parallel import process_groups
from videogrpo.parallel import fsdp
from videogrpo.config import from_dict

ctx = process_groups.init("cpu", "gloo", 1)
cfg = from_dict({"parallel": {"data_parallel": "hsdp", "shard_group_size": 2, "backend": "gloo"}}, partial=True)
mesh = fsdp.device_mesh(cfg, ctx.world_size, "cpu")
def minutes(group):
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds() / 60
if ctx.rank == 0:
    print(json.dumps({"default": minutes(dist.group.WORLD), "shard": minutes(mesh.get_group("shard")),
                      "replicate": minutes(mesh.get_group("replicate"))}))
process_groups.shutdown()
"""


def test_the_hsdp_mesh_groups_wait_240_minutes_as_the_default_group(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(probe)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("{"))
    assert line == '{"default": 240.0, "shard": 240.0, "replicate": 240.0}', line
