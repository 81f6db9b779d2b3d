"""Multi-node training on Kubernetes: one indexed Job and its headless Service per run, by the manual contract.

snakemake-executor-plugin-kubernetes runs every job as one pod, so a training run of several nodes cannot go
through it. Instead the train rule (a local rule under profiles/kubernetes) runs `videogrpo stage k8s-job`, which
writes a Job of `parallel.nodes` pods (completionMode Indexed, parallelism = completions = nodes) and a
headless Service beside the run, checks both against the Kubernetes API schemas, applies them with kubectl and
waits for the Job to end. Every pod runs the same `videogrpo stage train` command as the rule would on one machine,
with the launch contract of launch.py set from its place in the Job: MASTER_ADDR the first pod's stable DNS name
`<job>-0.<service>` (the Service is the pods' subdomain), WORLD_SIZE the number of pods, RANK the pod's
completion index; processes per pod = parallel.procs_per_node = GPUs per pod.

The pods share the workflow directory through a ReadWriteMany volume (kubernetes.volume_claim), mounted at the
path where the driver runs Snakemake: the rank-0 pod writes the outputs and manifest the rule declares, and the
checkpoints that a restarted pod resumes from. A failed pod is started again (train.retries per node) and
resumes; exit 3, 4 and 5 (configuration, digest, data: they repeat) fail the Job at once; an eviction is not
counted.

What the pods have in common with the executor plugin's pods comes from where the plugin reads it, never from the
config (PodSettings): the image, namespace, service account and privileged mode from the executor's flags, the
CPUs, memory, /dev/shm, GPU manufacturer, node type and interconnect settings from the train rule's resources (the
profile's default-resources and set-resources: train).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from videogrpo import atomic
from videogrpo.config import Config
from videogrpo.errors import ConfigError, VideoGRPOError
from videogrpo.provenance import interconnect

# The API version the specs are checked against (kubernetes-validate, strict): backoffLimitPerIndex and
# maxFailedIndexes are GA from 1.33, the pods' job-completion-index label from 1.28.
KUBERNETES_VERSION = "1.33.0"
CONTAINER = "train"
# Exit codes of `videogrpo` whose failures repeat on any node (errors.py): the Job fails at once.
FINAL_EXIT_CODES = (3, 4, 5)
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}


@dataclass(frozen=True)
class PodSettings:
    """What the training Job's pods share with the executor plugin's pods (the workflow hands them over from the
    executor's settings and the train rule's resources, common.smk `train_job_submit`)."""

    image: str
    """--container-image: the image every pod runs (this checkout's environment, envs/)."""
    namespace: str = "default"
    """--kubernetes-namespace."""
    service_account: str = ""
    """--kubernetes-service-account-name (empty: the namespace's default)."""
    privileged: bool = False
    """--kubernetes-privileged."""
    cpus: int | None = None
    """The train rule's cpus_per_task: CPU cores a pod asks for (None: no request)."""
    mem_mb: int | None = None
    """The train rule's mem_mb: memory a pod asks for, in MB (None: no request)."""
    shm_mb: int = 65536
    """The train rule's shm_mb: size of the pods' memory-backed /dev/shm, in MB (NCCL and the data loaders need more
    than the container default of 64 MB)."""
    gpu_manufacturer: str = ""
    """The rule's gpu_manufacturer (`nvidia`, `amd`, in any case), as the executor plugin reads it for its GPU pods."""
    machine_type: str = ""
    """The rule's machine_type: the node.kubernetes.io/instance-type of the pods (empty: any)."""
    interconnect_env: str = ""
    """The rule's interconnect_env: NCCL and EFA settings (`NAME=value ...`, provenance/interconnect.py) in every
    pod's environment, as the rule's command hands them to a plugin pod's workers."""


# The train rule's resources each PodSettings field is read from (the profile's default-resources and set-resources).
POD_RESOURCES = {
    "--cpus": "cpus_per_task",
    "--mem-mb": "mem_mb",
    "--shm-mb": "shm_mb",
    "--gpu-manufacturer": "gpu_manufacturer",
    "--machine-type": "machine_type",
    "--interconnect-env": interconnect.RESOURCE,
}


def pod_arguments(image: str, executor: Any, resources: Any) -> list[str]:
    """The PodSettings arguments of `videogrpo stage k8s-job` that the workflow passes: the executor's
    --container-image, its settings (the plugin's ExecutorSettings; None in a dry run, whose command then leaves
    them out rather than show defaults the real run would not use) and the train rule's resources (`.get`)."""
    args = ["--image", image]
    if executor is not None:
        args += ["--namespace", getattr(executor, "namespace", None) or "default"]
        if account := getattr(executor, "service_account_name", None):
            args += ["--service-account", account]
        if getattr(executor, "privileged", False):
            args.append("--privileged")
    for flag, name in POD_RESOURCES.items():
        if resources.get(name) not in (None, ""):
            args += [flag, str(resources.get(name))]
    return args


def job_name(run_id: str) -> str:
    """A DNS-1123 label for the Job and its Service, from the run directory's name (`<recipe>-<12 hex>`): short
    enough that the pods' host names `<job>-<index>` stay within 63 characters."""
    recipe, _, digest = run_id.rpartition("-")
    stem = re.sub(r"[^a-z0-9]+", "-", recipe.lower()).strip("-")[:30].strip("-")
    return f"train-{stem}-{digest.lower()}" if stem else f"train-{digest.lower()}"


def trains_as_job(cfg: Config) -> bool:
    """Whether training is this module's Job (several nodes, or kubernetes.train_as_job), not a plugin pod."""
    return cfg.parallel.nodes > 1 or cfg.kubernetes.train_as_job


def settings_problems(cfg: Config, executor: str, marked: bool, image: str, default_image: str) -> list[str]:
    """What keeps the executor Snakemake runs (its name, --container-image) from running this workflow's pods."""
    if executor != "kubernetes":
        return []
    if not marked:
        return [
            "the kubernetes executor runs without profiles/kubernetes: its GPU jobs would ask for no GPU and "
            "multi-node training would be one pod; use --profile profiles/kubernetes (or set its default "
            "resource videogrpo_kubernetes=1 in your own profile)"
        ]
    if trains_as_job(cfg) and image == default_image:
        return [
            f"--container-image = {image!r}, Snakemake's own image: the training Job's pods run the image as it "
            f"is, and it holds no environment of this checkout; give --container-image the image built from envs/"
        ]
    return []


def problems(cfg: Config, workdir: str | os.PathLike) -> list[str]:
    """Why this run's topology cannot run as a training Job from `workdir`; empty when it can."""
    k = cfg.kubernetes
    found = []
    if not trains_as_job(cfg):
        found.append(
            f"parallel.nodes = {cfg.parallel.nodes}: one node trains in one pod of the executor plugin, not a Job "
            f"(unless kubernetes.train_as_job)"
        )
    if not k.volume_claim or not k.volume_path:
        found.append(
            f"kubernetes.volume_claim = {k.volume_claim!r}, volume_path = {k.volume_path!r}: the nodes of one "
            f"run share checkpoints and outputs through a ReadWriteMany PersistentVolumeClaim; set both"
        )
    elif not Path(os.path.abspath(workdir)).is_relative_to(os.path.abspath(k.volume_path)):
        found.append(
            f"the workflow directory {os.path.abspath(workdir)} is not under kubernetes.volume_path = "
            f"{k.volume_path!r}: the Job's pods see only the volume; run Snakemake from a directory on it"
        )
    if "mlflow" in cfg.logging.tracker and not k.env_secret:
        found.append(
            "logging.tracker has mlflow but kubernetes.env_secret is empty: the training Job's pods get the "
            "driver's MLFLOW_TRACKING_URI only from a Secret; create one with it (and its credentials) and name it "
            "in kubernetes.env_secret"
        )
    return found


def pod_problems(cfg: Config, pod: PodSettings) -> list[str]:
    """Why the pods' settings (PodSettings) cannot make this run's pods."""
    found = []
    if not pod.image:
        found.append("no image: give the image every pod runs (--image, the executor's --container-image)")
    if cfg.gpus_per_node and pod.gpu_manufacturer.lower() not in GPU_RESOURCES:
        found.append(
            f"gpu_manufacturer = {pod.gpu_manufacturer!r}: a pod of {cfg.gpus_per_node} GPUs needs `nvidia` or `amd`; "
            f"set gpu_manufacturer under default-resources of profiles/kubernetes/config.yaml"
        )
    return found


def interconnect_settings(pod: PodSettings) -> dict[str, str]:
    source = (
        f"the train rule's {interconnect.RESOURCE} resource (set-resources: train of profiles/kubernetes/config.yaml)"
    )
    return interconnect.parse(pod.interconnect_env, source)


def check(cfg: Config, workdir: str | os.PathLike, pod: PodSettings) -> None:
    found = problems(cfg, workdir) + pod_problems(cfg, pod)
    if found:
        raise ConfigError(
            f"multi-node training on Kubernetes ({cfg.parallel.nodes} nodes x {cfg.parallel.procs_per_node}):\n  - "
            + "\n  - ".join(found)
        )


def train_specs(
    cfg: Config, run_id: str, command: list[str], workdir: str | os.PathLike, pod_settings: PodSettings
) -> list[dict[str, Any]]:
    """The headless Service and the indexed Job of a run: every pod runs `command` in `workdir`."""
    check(cfg, workdir, pod_settings)
    k, p = cfg.kubernetes, pod_settings
    name = job_name(run_id)
    nodes = cfg.parallel.nodes

    def labels() -> dict[str, str]:  # a new dict each time: YAML would write a shared one as an alias
        return {"app.kubernetes.io/name": "videogrpo", "app.kubernetes.io/component": "train", "videogrpo/run": name}

    def meta() -> dict[str, Any]:
        return {"name": name, "namespace": p.namespace, "labels": labels()}

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(),
        "spec": {
            "clusterIP": "None",
            # The first pod's name must resolve before it is Ready: the others dial it while it starts.
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": name},
            "ports": [{"name": "rendezvous", "port": cfg.parallel.master_port, "protocol": "TCP"}],
        },
    }
    gpus = cfg.gpus_per_node
    amounts = {}
    if p.cpus is not None:
        amounts["cpu"] = str(p.cpus)
    if p.mem_mb is not None:
        amounts["memory"] = f"{p.mem_mb}M"
    if gpus:
        amounts[GPU_RESOURCES[p.gpu_manufacturer.lower()]] = str(gpus)
    env = [
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
        {"name": "MASTER_PORT", "value": str(cfg.parallel.master_port)},
        {"name": "WORLD_SIZE", "value": str(nodes)},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # The checkout's package on the volume, whose code digests the driver recorded; the image gives the
        # environment it runs in.
        {"name": "PYTHONPATH", "value": os.path.join(os.path.abspath(workdir), "src")},
        # In the spec, so that `kubectl describe` shows them and every pod has them before its launcher starts.
        *({"name": name, "value": value} for name, value in interconnect_settings(p).items()),
    ]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": p.image,
        "command": list(command),
        "workingDir": os.path.abspath(workdir),
        "env": env,
        **({"envFrom": [{"secretRef": {"name": k.env_secret}}]} if k.env_secret else {}),
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "volumeMounts": [
            {"name": "workflow", "mountPath": k.volume_path},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    if p.privileged:
        container["securityContext"] = {"privileged": True}
    pod: dict[str, Any] = {
        "subdomain": name,
        "restartPolicy": "Never",  # a failed pod is replaced by the Job (podFailurePolicy needs Never)
        "containers": [container],
        "volumes": [
            {"name": "workflow", "persistentVolumeClaim": {"claimName": k.volume_claim}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{p.shm_mb}M"}},
        ],
    }
    if gpus:  # the taint GPU nodes carry, as the executor plugin tolerates it for its GPU pods
        taint = GPU_RESOURCES[p.gpu_manufacturer.lower()]
        pod["tolerations"] = [{"key": taint, "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    if p.machine_type:
        pod["nodeSelector"] = {"node.kubernetes.io/instance-type": p.machine_type}
    if p.service_account:
        pod["serviceAccountName"] = p.service_account
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(),
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimitPerIndex": cfg.train.retries,
            "maxFailedIndexes": 0,  # a node out of retries ends the Job: the others cannot train without it
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "In",
                            "values": list(FINAL_EXIT_CODES),
                        },
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {"metadata": {"labels": labels()}, "spec": pod},
        },
    }
    return [service, job]


def validate(specs: list[dict[str, Any]], version: str = KUBERNETES_VERSION) -> None:
    """Each spec against the Kubernetes API schemas of `version`, strict (an unknown field is an error)."""
    import kubernetes_validate

    for spec in specs:
        try:
            kubernetes_validate.validate(spec, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(part) for part in err.path) or "(top level)"
            raise VideoGRPOError(
                f"{spec.get('kind')} {spec.get('metadata', {}).get('name')}: {where}: {err.message} "
                f"(Kubernetes {version} API schema)"
            ) from None


def to_yaml(specs: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(specs, sort_keys=False)


def job_state(job: dict[str, Any]) -> str:
    """`complete`, `failed` or `running`, from a Job object's status conditions (`kubectl get job -o json`)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "complete"
        if condition.get("status") == "True" and condition.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    return "running"


def _kubectl(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise VideoGRPOError(
            "kubectl not found: the train rule applies the training Job with kubectl on the driver; install it, "
            "or run `videogrpo stage k8s-job` without --apply and apply the written spec yourself"
        ) from None


def apply_and_wait(spec_path: Path, namespace: str, name: str, poll_s: float) -> int:
    done = _kubectl("apply", "-f", str(spec_path))
    if done.returncode:
        raise VideoGRPOError(f"kubectl apply -f {spec_path} failed: {done.stderr.strip()}")
    print(f"[k8s-job] applied {spec_path}: {done.stdout.strip()}", file=sys.stderr, flush=True)
    print(f"[k8s-job] follow it with: kubectl -n {namespace} get pods -l batch.kubernetes.io/job-name={name}")
    while True:
        got = _kubectl("-n", namespace, "get", "job", name, "-o", "json")
        if got.returncode:
            raise VideoGRPOError(f"kubectl get job {name} failed: {got.stderr.strip()}; was it deleted?")
        state = job_state(json.loads(got.stdout))
        if state != "running":
            break
        time.sleep(poll_s)
    logs = _kubectl(
        "-n", namespace, "logs", "--tail=200", "-l", f"batch.kubernetes.io/job-name={name},{INDEX_ANNOTATION}=0"
    )
    print(logs.stdout, end="")
    if state == "failed":
        print(
            f"[k8s-job] Job {name} failed; its pods: kubectl -n {namespace} describe job {name}. Rerunning the "
            f"workflow deletes it and resumes from the last checkpoint",
            file=sys.stderr,
        )
        return 2
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-json", required=True, help="the train stage's config (JSON, or @file)")
    parser.add_argument("--run-id", required=True, help="the run directory's name: names the Job and Service")
    parser.add_argument("--spec", type=Path, required=True, help="where to write the Service and Job (YAML)")
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="the workflow directory the pods run in")
    # The pods' settings (PodSettings): the workflow passes the executor's flags and the train rule's resources.
    defaults = PodSettings(image="")
    parser.add_argument("--image", default="", help="the image every pod runs (the executor's --container-image)")
    parser.add_argument("--namespace", default=defaults.namespace, help="the executor's --kubernetes-namespace")
    parser.add_argument("--service-account", default="", help="the executor's --kubernetes-service-account-name")
    parser.add_argument("--privileged", action="store_true", help="the executor's --kubernetes-privileged")
    parser.add_argument("--cpus", type=int, help="CPU cores per pod (the train rule's cpus_per_task)")
    parser.add_argument("--mem-mb", type=int, help="memory per pod in MB (the train rule's mem_mb)")
    parser.add_argument(
        "--shm-mb", type=int, default=defaults.shm_mb, help="the pods' /dev/shm in MB (the train rule's shm_mb)"
    )
    parser.add_argument("--gpu-manufacturer", default="", help="nvidia or amd (the rule's gpu_manufacturer)")
    parser.add_argument("--machine-type", default="", help="the pods' node type (the rule's machine_type)")
    parser.add_argument(
        "--interconnect-env", default="", help="NCCL and EFA settings of every pod (the rule's interconnect_env)"
    )
    parser.add_argument("--apply", action="store_true", help="apply the spec with kubectl and wait for the Job")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="how often --apply checks the Job")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command every pod runs")


def run(args: argparse.Namespace) -> int:
    from videogrpo import config as config_mod

    cfg = config_mod.from_dict(config_mod.sections_from_argument(args.config_json), partial=True)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise VideoGRPOError(
            "k8s-job: no training command after `--` (e.g. `-- videogrpo stage train --config-json ...`)"
        )
    pod = PodSettings(
        args.image,
        args.namespace,
        args.service_account,
        args.privileged,
        args.cpus,
        args.mem_mb,
        args.shm_mb,
        args.gpu_manufacturer,
        args.machine_type,
        args.interconnect_env,
    )
    specs = train_specs(cfg, args.run_id, command, args.workdir, pod)
    validate(specs)
    atomic.write_text(args.spec, to_yaml(specs))
    name = job_name(args.run_id)
    print(f"[k8s-job] wrote {args.spec}: Service and indexed Job {name} ({cfg.parallel.nodes} pods)", file=sys.stderr)
    if not args.apply:
        print(f"kubectl apply -f {args.spec}")
        return 0
    if _kubectl("-n", pod.namespace, "get", "job", name).returncode == 0:
        # A Job of an earlier attempt (failed, or its driver interrupted): the new one resumes its checkpoints.
        # Foreground: its pods are gone before the new ones take their names and DNS entries.
        _kubectl("-n", pod.namespace, "delete", "job", name, "--cascade=foreground", "--wait=true")
    return apply_and_wait(args.spec, pod.namespace, name, args.poll_seconds)
