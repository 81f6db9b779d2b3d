"""The cluster resources of a stage job that follow from the recipe: its GPUs, nodes and tasks (the topology fixes
them) and how a SLURM job runs its command. Everything a site chooses (partition, account, qos, constraint,
memory, runtime, CPUs, the Kubernetes node type and GPU manufacturer) is the profile's: default-resources for every
job, set-resources per rule (profiles/slurm/config.yaml, profiles/kubernetes/config.yaml), which Snakemake lays
over these. Local execution ignores them.

Kinds: `train` (every node of the run, all their GPUs), `preflight` (one GPU), `generate` (a matrix cell: up to
matrix.procs GPUs of one node) and `cpu` (data, scorer-runtime, evaluation-set and scoring jobs: nothing follows from
the recipe, the profile sizes them all).
"""

from __future__ import annotations

from typing import Any

from videogrpo.config import Config

KINDS = ("train", "preflight", "generate", "cpu")


def gpus(cfg: Config, kind: str) -> int:
    """GPUs per node of a job of this kind: training takes one per process (none on cpu), preflight checks with
    one, a matrix cell generates with up to matrix.procs."""
    per_node = cfg.gpus_per_node
    return {"train": per_node, "preflight": min(per_node, 1), "generate": min(per_node, cfg.matrix.procs)}.get(kind, 0)


def slurm_resources(cfg: Config, kind: str) -> dict[str, Any]:
    """snakemake-executor-plugin-slurm's resources of a job of this kind that the recipe fixes."""
    if kind == "cpu":
        return {}
    nodes = cfg.parallel.nodes if kind == "train" else 1
    # tasks_per_gpu 0: never --ntasks-per-gpu (the plugin's default for a GPU job is one task per GPU); each stage
    # starts one process per GPU itself.
    res: dict[str, Any] = {"nodes": nodes, "tasks": nodes, "tasks_per_gpu": 0}
    if nodes > 1:
        # The rule's shell runs once, on the first node, and `videogrpo stage train` starts one launcher per node
        # with srun (launch/torchrun.py); `mpi` keeps the job step from wrapping that shell in an srun of its own.
        # The plugin refuses `mpi` with one task, so a one-node job runs as any other.
        res["mpi"] = "srun"
    if count := gpus(cfg, kind):
        res["gres"] = f"gpu:{count}"
    return res


def kubernetes_resources(cfg: Config, kind: str) -> dict[str, Any]:
    """The pod of a job under snakemake-executor-plugin-kubernetes: its GPUs (the plugin's `gpu`). A training run of
    several nodes is the indexed Job of launch/k8s_job.py, whose pods take their sizes from the train rule's
    resources (k8s_job.PodSettings)."""
    count = gpus(cfg, kind)
    return {"gpu": count} if count else {}


def job_resources(cfg: Config, kind: str, kubernetes: bool) -> dict[str, Any]:
    """A job's derived resources under profiles/kubernetes (`kubernetes`) or SLURM."""
    if kind not in KINDS:
        raise ValueError(f"resource kind {kind!r}: one of {KINDS}")
    return kubernetes_resources(cfg, kind) if kubernetes else slurm_resources(cfg, kind)
