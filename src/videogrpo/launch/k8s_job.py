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
checkpoints that a restarted pod resumes from. A failed pod is started again (kubernetes.train_retries per
node) and resumes; exit 3, 4 and 5 (configuration, digest, data: they repeat) fail the Job at once; an eviction
is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from videogrpo import atomic
from videogrpo.config import Config
from videogrpo.errors import ConfigError, VideoGRPOError

# The API version the specs are checked against (kubernetes-validate, strict): backoffLimitPerIndex and
# maxFailedIndexes are GA from 1.33, the pods' job-completion-index label from 1.28.
KUBERNETES_VERSION = "1.33.0"
CONTAINER = "train"
# Exit codes of `videogrpo` whose failures repeat on any node (errors.py): the Job fails at once.
FINAL_EXIT_CODES = (3, 4, 5)
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}


def gpus_per_node(cfg: Config) -> int:
    """GPUs of one training pod: kubernetes.gpus_per_node, else one per process on cuda, none on cpu."""
    if cfg.kubernetes.gpus_per_node is not None:
        return cfg.kubernetes.gpus_per_node
    return cfg.parallel.procs_per_node if cfg.parallel.device == "cuda" else 0


def job_name(run_id: str) -> str:
    """A DNS-1123 label for the Job and its Service, from the run directory's name (`<recipe>-<12 hex>`): short
    enough that the pods' host names `<job>-<index>` stay within 63 characters."""
    recipe, _, digest = run_id.rpartition("-")
    stem = re.sub(r"[^a-z0-9]+", "-", recipe.lower()).strip("-")[:30].strip("-")
    return f"train-{stem}-{digest.lower()}" if stem else f"train-{digest.lower()}"


def trains_as_job(cfg: Config) -> bool:
    """Whether training is this module's Job (several nodes, or kubernetes.train_as_job), not a plugin pod."""
    return cfg.parallel.nodes > 1 or cfg.kubernetes.train_as_job


def settings_problems(cfg: Config, executor: str, marked: bool, image: str, namespace: str, account: str) -> list[str]:
    """What disagrees between the executor Snakemake runs (its name, --container-image, --kubernetes-namespace,
    --kubernetes-service-account-name) and the config: the plugin's pods and the training Job must be alike."""
    if executor != "kubernetes":
        return []
    if not marked:
        return [
            "the kubernetes executor runs without profiles/kubernetes: its GPU jobs would ask for no GPU and "
            "multi-node training would be one pod; use --profile profiles/kubernetes (or set its default "
            "resource videogrpo_kubernetes=1 in your own profile)"
        ]
    if not trains_as_job(cfg):
        return []
    k = cfg.kubernetes
    given = {"image": (image, "--container-image"), "namespace": (namespace, "--kubernetes-namespace")}
    given["service_account"] = (account or "", "--kubernetes-service-account-name")
    return [
        f"kubernetes.{name} = {getattr(k, name)!r} but {flag} = {value!r}: the training Job's pods and the other "
        f"pods must run alike; give both the same value"
        for name, (value, flag) in given.items()
        if value != getattr(k, name)
    ]


def problems(cfg: Config, workdir: str | os.PathLike) -> list[str]:
    """Why this run's topology cannot run as a training Job from `workdir`; empty when it can."""
    k = cfg.kubernetes
    found = []
    if not trains_as_job(cfg):
        found.append(
            f"parallel.nodes = {cfg.parallel.nodes}: one node trains in one pod of the executor plugin, not a Job "
            f"(unless kubernetes.train_as_job)"
        )
    if not k.image:
        found.append(
            "kubernetes.image is empty: the training Job's pods need the image the other pods run "
            "(--container-image); set kubernetes.image to the same image"
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
    gpus = gpus_per_node(cfg)
    if cfg.parallel.device == "cuda" and gpus != cfg.parallel.procs_per_node:
        found.append(
            f"kubernetes.gpus_per_node = {gpus} but parallel.procs_per_node = {cfg.parallel.procs_per_node}: "
            f"a pod starts one process per GPU; make them equal"
        )
    return found


def check(cfg: Config, workdir: str | os.PathLike) -> None:
    found = problems(cfg, workdir)
    if found:
        raise ConfigError(
            f"multi-node training on Kubernetes ({cfg.parallel.nodes} nodes x {cfg.parallel.procs_per_node}):\n  - "
            + "\n  - ".join(found)
        )


def train_specs(cfg: Config, run_id: str, command: list[str], workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """The headless Service and the indexed Job of a run: every pod runs `command` in `workdir`."""
    check(cfg, workdir)
    k = cfg.kubernetes
    name = job_name(run_id)
    nodes = cfg.parallel.nodes

    def labels() -> dict[str, str]:  # a new dict each time: YAML would write a shared one as an alias
        return {"app.kubernetes.io/name": "videogrpo", "app.kubernetes.io/component": "train", "videogrpo/run": name}

    def meta() -> dict[str, Any]:
        return {"name": name, "namespace": k.namespace, "labels": labels()}

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
    gpus = gpus_per_node(cfg)
    amounts = {"cpu": str(k.cpus_per_node), "memory": f"{k.mem_mb_per_node}M"}
    if gpus:
        amounts[GPU_RESOURCES[k.gpu_manufacturer]] = str(gpus)
    env = [
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
        {"name": "MASTER_PORT", "value": str(cfg.parallel.master_port)},
        {"name": "WORLD_SIZE", "value": str(nodes)},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # The checkout's package on the volume, whose code digests the driver recorded; the image gives the
        # environment it runs in.
        {"name": "PYTHONPATH", "value": os.path.join(os.path.abspath(workdir), "src")},
    ]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": k.image,
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
    if k.privileged:
        container["securityContext"] = {"privileged": True}
    pod: dict[str, Any] = {
        "subdomain": name,
        "restartPolicy": "Never",  # a failed pod is replaced by the Job (podFailurePolicy needs Never)
        "containers": [container],
        "volumes": [
            {"name": "workflow", "persistentVolumeClaim": {"claimName": k.volume_claim}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{k.shm_mb}M"}},
        ],
    }
    if gpus:  # the taint GPU nodes carry, as the executor plugin tolerates it for its GPU pods
        taint = GPU_RESOURCES[k.gpu_manufacturer]
        pod["tolerations"] = [{"key": taint, "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    if k.machine_type:
        pod["nodeSelector"] = {"node.kubernetes.io/instance-type": k.machine_type}
    if k.service_account:
        pod["serviceAccountName"] = k.service_account
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(),
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimitPerIndex": k.train_retries,
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
    specs = train_specs(cfg, args.run_id, command, args.workdir)
    validate(specs)
    atomic.write_text(args.spec, to_yaml(specs))
    name = job_name(args.run_id)
    print(f"[k8s-job] wrote {args.spec}: Service and indexed Job {name} ({cfg.parallel.nodes} pods)", file=sys.stderr)
    if not args.apply:
        print(f"kubectl apply -f {args.spec}")
        return 0
    if _kubectl("-n", cfg.kubernetes.namespace, "get", "job", name).returncode == 0:
        # A Job of an earlier attempt (failed, or its driver interrupted): the new one resumes its checkpoints.
        # Foreground: its pods are gone before the new ones take their names and DNS entries.
        _kubectl("-n", cfg.kubernetes.namespace, "delete", "job", name, "--cascade=foreground", "--wait=true")
    return apply_and_wait(args.spec, cfg.kubernetes.namespace, name, args.poll_seconds)
