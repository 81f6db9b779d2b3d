"""Where this machine sits in a training job, and the commands and environments that start it: SLURM, the manual
launch contract, or this machine alone.

One launcher runs per machine. It finds its place in the job (`from_environment`) from, in order:
- an srun task of a SLURM allocation (SLURM_NNODES, SLURM_NODEID, SLURM_LAUNCH_NODE_IPADDR: the first
  node hosts the rendezvous);
- the manual contract of docs/reference-system.md#launch: MASTER_ADDR, MASTER_PORT (default parallel.master_port),
  WORLD_SIZE = number of machines, RANK = this machine's rank; all three of MASTER_ADDR, WORLD_SIZE and
  RANK, or none of them;
- nothing: a local run on this machine.
Processes per machine come from parallel.procs_per_node. From that place: the `torchrun` command with a c10d
rendezvous on the first machine (`torchrun_argv`), its workers' environment (`worker_env`), and the `srun` command
that starts one launcher per node of an allocation (`srun_argv`). Running them, and the per-node preflight before,
is launch/node.py's.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from videogrpo.config import Config
from videogrpo.errors import ConfigError
from videogrpo.preflight import node as node_preflight
from videogrpo.provenance import interconnect

CONTRACT_VARS = ("MASTER_ADDR", "WORLD_SIZE", "RANK")
# What torchrun's agent adds to every worker's environment unless it is set (torch.distributed.elastic's
# local_elastic_agent): part of what the workers see, so of what the train manifest records.
TORCHRUN_WORKER_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


@dataclass(frozen=True)
class Launch:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc: int
    source: str
    """Where the placement came from: `slurm`, `manual` or `local`."""

    @property
    def is_local(self) -> bool:
        return self.source == "local"

    @property
    def hosted_port(self) -> int | None:
        """The rendezvous port this machine binds, which the per-node checks find free: the first machine's of a
        launch over machines; None elsewhere and for a local run (torchrun picks a free port itself)."""
        return self.master_port if self.node_rank == 0 and not self.is_local else None


def slurm_port(cfg: Config, env: dict[str, str]) -> int:
    """A rendezvous port per job, so jobs sharing a node do not collide (MASTER_PORT overrides it)."""
    if env.get("MASTER_PORT"):
        return int(env["MASTER_PORT"])
    return cfg.parallel.master_port + int(env.get("SLURM_JOB_ID", "0")) % 1000


def from_environment(cfg: Config, env: dict[str, str] | None = None, check_nodes: bool = True) -> Launch:
    """This machine's place in the job. check_nodes=False (the preflight-only run) accepts an allocation of
    another size than parallel.nodes: the checks are per machine."""
    env = dict(os.environ if env is None else env)
    nproc = cfg.parallel.procs_per_node
    if env.get("SLURM_NNODES") and env.get("SLURM_NODEID") and env.get("SLURM_LAUNCH_NODE_IPADDR"):
        launch = Launch(
            int(env["SLURM_NNODES"]),
            int(env["SLURM_NODEID"]),
            env["SLURM_LAUNCH_NODE_IPADDR"],
            slurm_port(cfg, env),
            nproc,
            "slurm",
        )
    else:
        given = [v for v in CONTRACT_VARS if env.get(v)]
        port = int(env.get("MASTER_PORT") or cfg.parallel.master_port)
        if not given:
            launch = Launch(1, 0, "127.0.0.1", port, nproc, "local")
        elif len(given) < len(CONTRACT_VARS):
            missing = [v for v in CONTRACT_VARS if v not in given]
            raise ConfigError(
                f"launch contract: {', '.join(given)} set but {', '.join(missing)} missing; set all "
                f"of MASTER_ADDR, WORLD_SIZE (machines) and RANK (this machine), or none for a local run"
            )
        else:
            try:
                nnodes, node_rank = int(env["WORLD_SIZE"]), int(env["RANK"])
            except ValueError:
                raise ConfigError(
                    f"launch contract: WORLD_SIZE={env['WORLD_SIZE']!r} and RANK={env['RANK']!r} must be integers"
                ) from None
            if not 0 <= node_rank < nnodes:
                raise ConfigError(f"launch contract: RANK={node_rank} must be in [0, WORLD_SIZE={nnodes})")
            launch = Launch(nnodes, node_rank, env["MASTER_ADDR"], port, nproc, "manual")
    if check_nodes and launch.nnodes != cfg.parallel.nodes:
        raise ConfigError(
            f"parallel.nodes = {cfg.parallel.nodes} but this launch has {launch.nnodes} machines "
            f"({launch.source}); the run identity includes the topology, so they must agree"
        )
    return launch


def torchrun_argv(
    launch: Launch, module: str, module_args: list[str], join_timeout_s: float | None = None
) -> list[str]:
    """`join_timeout_s`: how long the rendezvous waits for every node (torchrun's default: 600 s)."""
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}"]
    if launch.is_local:
        # A free rendezvous port chosen by torchrun: local runs never collide with each other.
        argv += ["--standalone"]
    else:
        # is_host pins the rendezvous store to the first machine; left to torchrun's hostname match,
        # every launcher on a host that answers to MASTER_ADDR would race to bind the port.
        argv += [
            f"--nnodes={launch.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={launch.master_addr}:{launch.master_port}",
            "--rdzv-id=videogrpo",
            f"--rdzv-conf=is_host={'true' if launch.node_rank == 0 else 'false'}"
            + (f",join_timeout={math.ceil(join_timeout_s)}" if join_timeout_s else ""),
            "--max-restarts=0",
        ]
    return argv + ["-m", module] + module_args


def worker_env(cfg: Config, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the torchrun workers (and of the per-node preflight's probe).

    A fixed CPU thread count on every topology: torchrun sets OMP_NUM_THREADS=1 only when it starts several
    processes, and results of CPU kernels depend on the thread count, so it is set from parallel.cpu_threads.
    As the reference (section 12): TRITON_CACHE_DIR on node-local disk and
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, each unless the user set it.
    """
    env = dict(os.environ if env is None else env)
    threads = str(cfg.parallel.cpu_threads)
    return dict(env, **node_preflight.node_env(env), OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)


def workers_interconnect(workers: Mapping[str, str]) -> dict[str, str]:
    """The interconnect variables (provenance/interconnect.py) this machine's ranks see: those of their environment
    (`workers`, worker_env's) and torchrun's."""
    return interconnect.recorded({**TORCHRUN_WORKER_DEFAULTS, **workers})


def apply_interconnect(settings: Mapping[str, str], env: MutableMapping[str, str] | None = None) -> list[str]:
    """Put a profile's interconnect settings (provenance/interconnect.py) into `env`, this process's environment by
    default: what srun hands every node's launcher (--export=ALL) and worker_env every worker. Each one unless the
    environment already sets it (a site's module, a one-off `NCCL_DEBUG=INFO snakemake ...`), which wins; returns
    a line for each setting the environment overrode, so that neither source is silently dropped."""
    env = os.environ if env is None else env
    notes = []
    for name, value in settings.items():
        if name not in env:
            env[name] = value
        elif env[name] != value:
            notes.append(
                f"interconnect: {name}={env[name]} from the environment, not the profile's {value} "
                f"(unset it to use the profile's)"
            )
    return notes


def needs_srun(cfg: Config, env: dict[str, str] | None = None) -> bool:
    """In a SLURM allocation, outside any srun task, with more than one node: fan out with srun."""
    env = dict(os.environ if env is None else env)
    return bool(env.get("SLURM_JOB_ID")) and not env.get("SLURM_NODEID") and cfg.parallel.nodes > 1


def allocation_nodes(cfg: Config, env: dict[str, str] | None = None) -> int:
    """Nodes of the SLURM allocation this shell runs in (0 outside one, or inside an srun task).

    A Snakemake job's shell under the SLURM executor keeps SLURM_JOB_ID but not the node counts (the jobstep
    plugin strips them), so there the job's node count is parallel.nodes, as needs_srun assumes: never a
    silent "1", which would check the first node only.
    """
    env = dict(os.environ if env is None else env)
    if not env.get("SLURM_JOB_ID") or env.get("SLURM_NODEID"):
        return 0
    return int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or cfg.parallel.nodes)


def srun_argv(cfg: Config, command: list[str], nodes: int | None = None, kill_on_bad_exit: bool = True) -> list[str]:
    """One launcher per node of the allocation (the rule's shell runs once, on the first node).

    The preflight-only run passes the allocation's node count and lets every node finish its report
    (no --kill-on-bad-exit: one failing node does not cut the others' lines short).
    """
    nodes = cfg.parallel.nodes if nodes is None else nodes
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    if kill_on_bad_exit:
        argv.append("--kill-on-bad-exit=1")
    argv += ["--cpu-bind=none", "--export=ALL"]
    if cfg.gpus_per_node:
        argv.append(f"--gres=gpu:{cfg.gpus_per_node}")
    return argv + command
