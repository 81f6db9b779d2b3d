"""Starting torchrun on this machine: the launch contract of REFERENCE section 7.

Inputs: MASTER_ADDR (default 127.0.0.1), MASTER_PORT (parallel.master_port), WORLD_SIZE = number of
machines (default 1), RANK = this machine's rank, and processes per machine from
parallel.procs_per_node. When MASTER_ADDR, WORLD_SIZE and RANK are all absent the local defaults
apply; otherwise all three are required. The same launcher runs under SLURM (one per node, started
by srun) and by hand on every machine of a cluster without SLURM.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from videogrpo.config import Config
from videogrpo.errors import ConfigError

CONTRACT_VARS = ("MASTER_ADDR", "WORLD_SIZE", "RANK")


@dataclass(frozen=True)
class Launch:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc: int

    @property
    def is_local(self) -> bool:
        return self.nnodes == 1


def from_environment(cfg: Config, env: dict[str, str] | None = None) -> Launch:
    env = dict(os.environ if env is None else env)
    given = [v for v in CONTRACT_VARS if env.get(v)]
    port = int(env.get("MASTER_PORT") or cfg.parallel.master_port)
    if not given:
        launch = Launch(1, 0, "127.0.0.1", port, cfg.parallel.procs_per_node)
    elif len(given) < len(CONTRACT_VARS):
        missing = [v for v in CONTRACT_VARS if v not in given]
        raise ConfigError(f"launch contract: {', '.join(given)} set but {', '.join(missing)} missing; set all of "
                          f"MASTER_ADDR, WORLD_SIZE (machines) and RANK (this machine), or none for a local run")
    else:
        try:
            nnodes, node_rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        except ValueError:
            raise ConfigError(f"launch contract: WORLD_SIZE={env['WORLD_SIZE']!r} and RANK={env['RANK']!r} must be "
                              f"integers") from None
        if not 0 <= node_rank < nnodes:
            raise ConfigError(f"launch contract: RANK={node_rank} must be in [0, WORLD_SIZE={nnodes})")
        launch = Launch(nnodes, node_rank, env["MASTER_ADDR"], port, cfg.parallel.procs_per_node)
    if launch.nnodes != cfg.parallel.nodes:
        raise ConfigError(f"parallel.nodes = {cfg.parallel.nodes} but this launch has {launch.nnodes} machines "
                          f"(WORLD_SIZE); the run identity includes the topology, so they must agree")
    return launch


def torchrun_argv(launch: Launch, module: str, module_args: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}"]
    if launch.is_local and launch.master_addr in ("127.0.0.1", "localhost"):
        # A free rendezvous port chosen by torchrun: local runs never collide with each other.
        argv += ["--standalone"]
    else:
        argv += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={launch.master_addr}:{launch.master_port}", "--rdzv-id=videogrpo"]
    return argv + ["-m", module] + module_args
