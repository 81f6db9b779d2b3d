"""The cluster resources of each kind of stage job, from the config (`slurm:`, `kubernetes:`, `parallel:`); none
hard-coded. Local execution ignores them.

Kinds: `train` (every node of the run, all their GPUs), `preflight` (one GPU and the cores and memory of
`slurm.stage_*`), `generate` (a matrix cell: matrix.procs GPUs of one node) and `cpu` (data, scorer-runtime and
scoring jobs).
"""

from __future__ import annotations

from typing import Any

from videogrpo.config import Config
from videogrpo.launch import k8s_job

KINDS = ("train", "preflight", "generate", "cpu")


def slurm_resources(cfg: Config, kind: str) -> dict[str, Any]:
    """snakemake-executor-plugin-slurm's resources of a job of this kind."""
    s = cfg.slurm
    gpus = s.gpus_per_node
    if gpus is None:
        gpus = cfg.parallel.procs_per_node if cfg.parallel.device == "cuda" else 0
    res: dict[str, Any] = {}
    if s.partition:
        res["slurm_partition"] = s.partition
    if s.account:
        res["slurm_account"] = s.account
    if kind == "cpu":
        return dict(res, cpus_per_task=s.data_cpus, mem_mb=s.data_mem_mb, runtime=s.data_minutes)
    if kind == "train":
        res.update(
            nodes=cfg.parallel.nodes,
            tasks=cfg.parallel.nodes,
            cpus_per_task=s.cpus_per_node,
            mem_mb=s.mem_mb_per_node,
            runtime=s.train_minutes,
        )
    else:
        res.update(
            nodes=1,
            tasks=1,
            cpus_per_task=s.stage_cpus,
            mem_mb=s.stage_mem_mb,
            runtime=s.preflight_minutes if kind == "preflight" else s.evaluate_minutes,
        )
        gpus = min(gpus, cfg.matrix.procs if kind == "generate" else 1)
    if gpus:
        res["gres"] = f"gpu:{gpus}"
    if s.constraint:
        res["constraint"] = s.constraint
    return res


def kubernetes_resources(cfg: Config, kind: str) -> dict[str, Any]:
    """The pod of a job under snakemake-executor-plugin-kubernetes, from `kubernetes:` (GPUs, their manufacturer,
    the node type) and the memory of `slurm:` (the same sizes on either scheduler). A training run of several nodes
    is the indexed Job of launch/k8s_job.py, sized there: its rule is local, its resources unused."""
    k, s = cfg.kubernetes, cfg.slurm
    # cpus_per_task: the worker counts the stages take from it; the pod's CPU request is the rule's threads.
    if kind == "cpu":
        return {"mem_mb": s.data_mem_mb, "cpus_per_task": s.data_cpus}
    if kind == "train":
        res, gpus = {"mem_mb": k.mem_mb_per_node, "cpus_per_task": k.cpus_per_node}, k8s_job.gpus_per_node(cfg)
    else:
        res = {"mem_mb": s.stage_mem_mb, "cpus_per_task": s.stage_cpus}
        gpus = min(k8s_job.gpus_per_node(cfg), cfg.matrix.procs if kind == "generate" else 1)
    if gpus:
        res.update(gpu=gpus, gpu_manufacturer=k.gpu_manufacturer)
        if k.machine_type:
            res["machine_type"] = k.machine_type
    return res


def job_resources(cfg: Config, kind: str, kubernetes: bool) -> dict[str, Any]:
    """A job's resources under profiles/kubernetes (`kubernetes`) or SLURM."""
    if kind not in KINDS:
        raise ValueError(f"resource kind {kind!r}: one of {KINDS}")
    return kubernetes_resources(cfg, kind) if kubernetes else slurm_resources(cfg, kind)
