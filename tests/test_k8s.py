"""Kubernetes: the training Job and Service of k8s_job.py against the API schemas (offline, strict), their launch
contract read back through launch.py, and dry runs with profiles/kubernetes against a real S3-protocol server
(moto's, on loopback: the executor plugin implies object storage). No cluster runs here."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from demo import copy_checkout, jobs_run, run

from videogrpo import cli, config
from videogrpo.errors import ConfigError, VideoGRPOError
from videogrpo.launch import k8s_job, torchrun
from videogrpo.provenance import interconnect

REPO = Path(__file__).resolve().parents[1]
IMAGE = "registry.example.org/videogrpo:0.1"


def recipe(name: str, **kubernetes) -> config.Config:
    data = yaml.safe_load((REPO / f"config/recipes/{name}.yaml").read_text())
    data["kubernetes"] = kubernetes
    return config.from_dict(data, partial=True)


def five_b(tmp_path: Path, **extra) -> config.Config:
    return recipe("rl_5b_cps", volume_claim="videogrpo-shared", volume_path=str(tmp_path), **extra)


# What the Job's pods share with the plugin's: the executor's flags and the train rule's resources, as the workflow
# passes them from profiles/kubernetes (set-resources: train, with the node type set).
POD = k8s_job.PodSettings(
    image=IMAGE,
    namespace="videogrpo",
    service_account="trainer",
    cpus=64,
    mem_mb=512000,
    shm_mb=65536,
    gpu_manufacturer="nvidia",
    machine_type="p5.48xlarge",
    interconnect_env="NCCL_DEBUG=WARN FI_PROVIDER=efa FI_EFA_USE_DEVICE_RDMA=1",
)


def pod_env(container: dict, index: int) -> dict[str, str]:
    """The container's environment as the kubelet gives it to the pod of completion index `index`."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == f"metadata.annotations['{k8s_job.INDEX_ANNOTATION}']"
            env[item["name"]] = str(index)
    return env


def test_the_5b_recipe_trains_as_one_indexed_job_whose_pods_follow_the_manual_launch_contract(tmp_path):
    cfg = five_b(tmp_path)
    workdir = tmp_path / "videogrpo"
    command = ["videogrpo", "stage", "train", "--config-json", "@results/.stage-config/train-x.json"]
    service, job = k8s_job.train_specs(cfg, "rl_5b_cps-0123456789ab", command, workdir, POD)
    k8s_job.validate([service, job])
    name = "train-rl-5b-cps-0123456789ab"
    assert (service["kind"], service["metadata"]["name"], job["kind"], job["metadata"]["name"]) == (
        "Service",
        name,
        "Job",
        name,
    )
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 16, 16)
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == name  # the pods' DNS names <job>-<index>.<service>
    (container,) = pod["containers"]
    assert container["image"] == IMAGE and container["command"] == command
    assert container["workingDir"] == str(workdir)
    assert {"name": "PYTHONPATH", "value": f"{workdir}/src"} in container["env"]  # the checkout's package
    assert container["resources"]["limits"] == {"cpu": "64", "memory": "512000M", "nvidia.com/gpu": "8"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert pod["serviceAccountName"] == "trainer" and job["metadata"]["namespace"] == "videogrpo"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["workflow"]["persistentVolumeClaim"] == {"claimName": "videogrpo-shared"}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "65536M"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"workflow": str(tmp_path), "shm": "/dev/shm"}
    # Auto-resume: a failed pod is started again (per node) and resumes; errors that repeat end the Job.
    assert pod["restartPolicy"] == "Never"
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (1, 0)
    fail, ignore = spec["podFailurePolicy"]["rules"]
    assert fail == {
        "action": "FailJob",
        "onExitCodes": {"containerName": container["name"], "operator": "In", "values": [3, 4, 5]},
    }
    assert [ConfigError.exit_code, 4, 5] == fail["onExitCodes"]["values"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # Every pod's place in the run, as the launcher reads it from the pod's environment, and the profile's
    # interconnect settings, which its launcher hands to the workers.
    efa = {"NCCL_DEBUG": "WARN", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
    for index in (0, 1, 15):
        where = torchrun.from_environment(cfg, pod_env(container, index))
        assert where == torchrun.Launch(16, index, f"{name}-0.{name}", 29500, 8, "manual")
        assert interconnect.recorded(torchrun.worker_env(cfg, pod_env(container, index))) == efa


def test_job_names_are_dns_labels_that_leave_room_for_the_pod_index():
    for run_id in ("rl_5b_cps-0123456789ab", "A_Very_Long_Recipe_Name_Beyond_Any_Sane_Length_Really-abcdef012345"):
        name = k8s_job.job_name(run_id)
        assert len(f"{name}-127") <= 63 and name.endswith(run_id[-12:])
        assert all(c.isalnum() and c.islower() or c.isdigit() or c == "-" for c in name) and name[0].isalpha()


def test_amd_gpus_privileged_containers_and_the_retries_of_each_node(tmp_path):
    cfg = five_b(tmp_path)
    cfg.train.retries = 3
    pod_settings = dataclasses.replace(POD, gpu_manufacturer="AMD", privileged=True)  # the plugin's case rule
    _, job = k8s_job.train_specs(cfg, "rl_5b_cps-0123456789ab", ["videogrpo", "stage", "train"], tmp_path, pod_settings)
    k8s_job.validate([job])
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert pod["tolerations"][0]["key"] == "amd.com/gpu" and pod["containers"][0]["securityContext"]["privileged"]
    assert job["spec"]["backoffLimitPerIndex"] == 3
    assert "envFrom" not in pod["containers"][0]  # no secret named, none referenced


def test_a_pod_without_sizes_asks_for_none_and_one_without_gpus_names_no_manufacturer(tmp_path):
    """A profile that sizes no training pod: the Job asks for no CPU or memory (the namespace's defaults apply),
    never for numbers the workflow made up; a CPU run's pods ask for no GPU."""
    bare = k8s_job.PodSettings(image=IMAGE, gpu_manufacturer="nvidia")
    _, job = k8s_job.train_specs(five_b(tmp_path), "rl_5b_cps-0123456789ab", ["videogrpo"], tmp_path, bare)
    k8s_job.validate([job])
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    cpu = five_b(tmp_path)
    cpu.parallel.device = "cpu"
    _, job = k8s_job.train_specs(cpu, "rl_5b_cps-0123456789ab", ["videogrpo"], tmp_path, k8s_job.PodSettings(IMAGE))
    k8s_job.validate([job])
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {}
    assert "tolerations" not in job["spec"]["template"]["spec"]


def test_the_pods_environment_comes_from_the_named_secret_never_from_the_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:hunter2@mlflow.example.org")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter3")
    cfg = five_b(tmp_path, env_secret="videogrpo-env")
    service, job = k8s_job.train_specs(cfg, "rl_5b_cps-0123456789ab", ["videogrpo", "stage", "train"], tmp_path, POD)
    k8s_job.validate([service, job])
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "videogrpo-env"}}]
    assert "hunter" not in yaml.safe_dump([service, job])


@pytest.mark.parametrize(
    "break_it,where",
    [
        (lambda job: job["spec"]["template"]["spec"]["containers"][0].pop("name"), "containers.0"),
        (lambda job: job["spec"].update(completions="16"), "spec.completions"),
        (lambda job: job["spec"]["template"]["spec"]["containers"][0].update(gpus=8), "'gpus' was unexpected"),
    ],
)
def test_a_broken_spec_fails_validation_naming_where(tmp_path, break_it, where):
    _, job = k8s_job.train_specs(
        five_b(tmp_path), "rl_5b_cps-0123456789ab", ["videogrpo", "stage", "train"], tmp_path, POD
    )
    broken = copy.deepcopy(job)
    break_it(broken)
    with pytest.raises(VideoGRPOError, match=f"Job train-rl-5b-cps-0123456789ab: .*{where}.*Kubernetes 1.33.0"):
        k8s_job.validate([broken])


def test_topologies_that_cannot_run_as_a_job_are_refused_naming_the_fields(tmp_path):
    with pytest.raises(ConfigError) as err:
        k8s_job.check(recipe("rl_5b_cps"), tmp_path, dataclasses.replace(POD, image=""))
    assert "kubernetes.volume_claim = ''" in str(err.value) and "no image" in str(err.value)
    elsewhere = five_b(tmp_path / "volume")
    assert k8s_job.problems(elsewhere, tmp_path) == [
        f"the workflow directory {tmp_path} is not under kubernetes.volume_path = '{tmp_path / 'volume'}': the "
        f"Job's pods see only the volume; run Snakemake from a directory on it"
    ]
    (unmade,) = k8s_job.pod_problems(five_b(tmp_path), dataclasses.replace(POD, gpu_manufacturer=""))
    assert unmade == (
        "gpu_manufacturer = '': a pod of 8 GPUs needs `nvidia` or `amd`; set gpu_manufacturer under "
        "default-resources of profiles/kubernetes/config.yaml"
    )
    tracked = five_b(tmp_path)
    tracked.logging.tracker = ["mlflow"]
    (untracked,) = k8s_job.problems(tracked, tmp_path)
    assert untracked.startswith("logging.tracker has mlflow but kubernetes.env_secret is empty")
    tracked.kubernetes.env_secret = "videogrpo-env"
    assert k8s_job.problems(tracked, tmp_path) == []
    (single,) = k8s_job.problems(recipe("rl_a14b_rule", volume_claim="c", volume_path="/"), tmp_path)
    assert single.startswith("parallel.nodes = 1: one node trains in one pod of the executor plugin, not a Job")


def test_the_job_state_comes_from_its_conditions():
    def job(*conditions):
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}

    assert k8s_job.job_state({"status": {"active": 16}}) == "running"
    assert k8s_job.job_state(job(("Suspended", "False"))) == "running"
    assert k8s_job.job_state(job(("SuccessCriteriaMet", "True"), ("Complete", "True"))) == "complete"
    assert k8s_job.job_state(job(("FailureTarget", "True"))) == "failed"
    assert k8s_job.job_state(job(("Failed", "True"))) == "failed"
    assert k8s_job.job_state(job(("Complete", "False"))) == "running"


def test_the_command_writes_a_spec_that_validates_and_says_how_to_apply_it(tmp_path, capsys, monkeypatch):
    cfg = five_b(tmp_path)
    config_file = tmp_path / "train.json"
    config_file.write_text(config.canonical_json(config.stage_view(cfg, "train")))
    spec = tmp_path / "runs/rl_5b_cps-0123456789ab/k8s/train-job.yaml"
    monkeypatch.chdir(tmp_path)
    argv = ["stage", "k8s-job", "--config-json", f"@{config_file}", "--run-id", "rl_5b_cps-0123456789ab"]
    argv += ["--spec", str(spec)]
    assert cli.main([*argv, "--", "videogrpo", "stage", "train"]) == ConfigError.exit_code  # no image, no GPU maker
    assert "no image" in capsys.readouterr().err
    argv += k8s_job.pod_arguments(IMAGE, None, {"gpu_manufacturer": "nvidia"})
    assert cli.main([*argv, "--", "videogrpo", "stage", "train", "--config-json", f"@{config_file}"]) == 0
    assert capsys.readouterr().out == f"kubectl apply -f {spec}\n"
    service, job = yaml.safe_load_all(spec.read_text())
    k8s_job.validate([service, job])
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["videogrpo", "stage", "train"]
    assert job["spec"]["template"]["spec"]["containers"][0]["workingDir"] == str(tmp_path)
    assert cli.main(argv) == 2  # no training command
    assert "no training command after `--`" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path / "no-kubectl-here"))
    assert cli.main([*argv, "--apply", "--", "videogrpo", "stage", "train"]) == 2
    assert "kubectl not found" in capsys.readouterr().err and spec.is_file()  # the spec stays, to apply by hand


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on loopback, with an empty bucket `videogrpo`."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).create_bucket(Bucket="videogrpo")
    yield endpoint
    server.stop()


S3_ARGS = ["--storage-s3-access-key", "test", "--storage-s3-secret-key", "test"]


def k8s_dry_run(cwd: Path, endpoint: str, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    argv = ["snakemake", "-n", "-p", "--profile", "profiles/kubernetes", "--container-image", IMAGE]
    argv += ["--default-storage-prefix", "s3://videogrpo/runs", "--storage-s3-endpoint-url", endpoint, *S3_ARGS]
    return run([*argv, *args], cwd, check=check, PYTHONPATH=str(REPO / "src"), **env)


def rule_block(text: str, rule: str) -> str:
    return text.split(f"rule {rule}:")[1].split("\n\n")[0]


def sh_block(text: str) -> list[str]:
    """The command lines of the first ```sh block of `text`, without their comments (as tests/doc_commands.py
    reads them)."""
    lines = re.search(r"```sh\n(.*?)```", text, re.S).group(1).splitlines()
    return [re.split(r"\s{2,}#", line)[0].strip() for line in lines if line.strip() and not line.startswith("#")]


def readme_steps() -> list[str]:
    return sh_block((REPO / "README.md").read_text().split("### On Kubernetes")[1].split("\n### ")[0])


def test_the_readmes_kubernetes_steps_run_as_written(s3_endpoint, tmp_path):
    """The README's steps as one script (its variables carry from line to line), from a copy of the checkout at the
    top of the "volume" (tmp_path), the placeholders filled with moto's bucket and endpoint, the keys in the
    environment as the README says; `-p` added to the dry run prints the jobs' commands."""
    steps = readme_steps()
    assert steps[-1].startswith("snakemake -n ") and steps[-1].endswith(" k8s.yaml")
    filled = "\n".join(steps).replace("<your bucket>", "videogrpo").replace("<your S3 endpoint URL>", s3_endpoint)
    assert "<" not in filled.replace("> k8s.yaml", ""), filled  # every placeholder filled
    checkout = copy_checkout(tmp_path / "videogrpo")
    env = {"PYTHONPATH": str(REPO / "src"), "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    # The 5B recipe's 16 nodes without k8s.yaml: refused without the Job's volume, before any job is planned.
    alone = [line for line in filled.splitlines() if "> k8s.yaml" not in line]
    alone[-1] = alone[-1].removesuffix(" k8s.yaml")
    refused = run(["bash", "-e", "-c", "\n".join(alone)], checkout, check=False, **env)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Job stats" not in said
    assert "parallel.nodes = 16 trains as one indexed Job, which cannot run here" in said
    # With it: every stage planned in the bucket; training is the k8s-job command around the training command.
    out = run(["bash", "-e", "-c", filled.replace("snakemake -n ", "snakemake -n -p ", 1)], checkout, **env)
    written = yaml.safe_load((checkout / "k8s.yaml").read_text())
    assert written == {"kubernetes": {"volume_claim": "videogrpo-shared", "volume_path": str(tmp_path)}}
    text = out.stdout + out.stderr
    assert set(jobs_run(text)) >= {"fetch_model", "preflight", "train", "generate_cell", "report"}
    assert "s3://videogrpo/videogrpo/results/runs/rl_5b_cps-" in text
    train = rule_block(text, "train")
    (shell,) = [line for line in train.splitlines() if line.startswith("Shell command: ")]
    submit, _, training = shell.removeprefix("Shell command: ").partition(" -- ")
    run_id = config.run_identity(five_b(tmp_path), (REPO / "config/tasks/vbvr_in_domain_50.txt").read_text())
    assert submit.startswith("videogrpo stage k8s-job --config-json @results/.stage-config/train-")
    assert f"--run-id {run_id} --spec results/runs/{run_id}/k8s/train-job.yaml" in submit
    # The Job's pods: the executor's image, the train rule's size from the profile.
    assert "--image registry.example.org/videogrpo:0.1 --cpus 64 --mem-mb 512000 --shm-mb 65536" in submit
    assert submit.endswith(" --apply") and training.startswith("videogrpo stage train --config-json @results/")
    for stage in ("preflight", "generate_cell"):  # one-GPU pods through the executor plugin, sized by the profile
        block = rule_block(text, stage)
        assert "gpu=1" in block and "gpu_manufacturer=nvidia" in block


def test_the_readmes_kubernetes_steps_with_placeholders_left_in_stop_in_one_line_each(tmp_path):
    """Run as printed: the placeholders of the bucket and the endpoint, no keys. The check before Snakemake says
    what is wrong, one line each, and the steps stop there (Snakemake's S3 plugin would end in a traceback of
    botocore's); with a bucket and an endpoint but no keys, the workflow itself says so in one line."""
    checkout = copy_checkout(tmp_path / "videogrpo")
    no_keys = {"PYTHONPATH": str(REPO / "src"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    no_keys.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    script = "\n".join(readme_steps())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ACCESS", "AWS_SECRET", "SNAKEMAKE_STORAGE"))}
    out = subprocess.run(
        ["bash", "-e", "-c", script], cwd=checkout, env={**env, **no_keys}, capture_output=True, text=True
    )
    said = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2 and len(said) == 3, said
    assert said[0].startswith("error: --default-storage-prefix 's3://<your bucket>/videogrpo': '<your bucket>' is no")
    assert said[1].startswith("error: SNAKEMAKE_STORAGE_S3_ENDPOINT_URL (or --storage-s3-endpoint-url) = '<your S3 ")
    assert said[2].startswith("error: object storage: no credentials for the bucket: give the bucket's keys in AWS_")
    assert not (checkout / "k8s.yaml").exists() and not (checkout / ".snakemake").exists()  # Snakemake never ran
    (checkout / "k8s.yaml").write_text("kubernetes:\n  volume_claim: videogrpo-shared\n  volume_path: /shared\n")
    dry = readme_steps()[-1].replace('"$BUCKET"', "s3://videogrpo/runs")
    out = subprocess.run(["bash", "-c", dry], cwd=checkout, env={**env, **no_keys}, capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "object storage: no credentials for the bucket" in text, text[-3000:]
    assert "Traceback" not in text and "Additional quoting" not in text and "Job stats" not in text
    # Ignored: a checkout with your settings in it stays clean in every manifest's git state.
    assert subprocess.run(["git", "check-ignore", "-q", "k8s.yaml"], cwd=REPO).returncode == 0


def test_the_kubernetes_pages_steps_are_the_readmes(tmp_path):
    """docs/kubernetes.md shows the README's steps with its `k8s.yaml` as YAML and the checkout's place on the
    volume: the same variables and dry run (which the README's test runs), the run is that line without `-n`, and
    the README's printf writes the page's `k8s.yaml` for a checkout at the top of the volume."""
    section = (REPO / "docs/kubernetes.md").read_text().split("\n## ")[0]
    k8s_yaml = yaml.safe_load(re.search(r"`k8s.yaml`:\n\n```yaml\n(.*?)```", section, re.S).group(1))
    cd, bucket, endpoint, check, dry, real = sh_block(section)
    bucket_set, endpoint_set, check_set, write, dry_run = readme_steps()
    assert (bucket, endpoint, check, dry) == (bucket_set, endpoint_set, check_set, dry_run)
    assert real.split() == [arg for arg in dry.split() if arg != "-n"]
    assert cd == f"cd {k8s_yaml['kubernetes']['volume_path']}/videogrpo"
    (tmp_path / "videogrpo").mkdir()
    subprocess.run(["bash", "-e", "-c", write], cwd=tmp_path / "videogrpo", check=True)
    written = yaml.safe_load((tmp_path / "videogrpo/k8s.yaml").read_text())
    assert written == {"kubernetes": {**k8s_yaml["kubernetes"], "volume_path": str(tmp_path)}}


def test_the_a14b_recipe_trains_in_one_pod_of_the_plugin(s3_endpoint, tmp_path):
    checkout = copy_checkout(tmp_path / "videogrpo")
    # With MLflow: the plugin's pods are handed the driver's MLFLOW_* variables (workflow.register_envvars).
    tracked = ["--config", "logging={tracker: [mlflow]}"]
    recipe = ["--configfile", "config/recipes/rl_a14b_rule.yaml"]
    out = k8s_dry_run(checkout, s3_endpoint, *recipe, *tracked, "--", "train", MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    text = out.stdout + out.stderr
    train = rule_block(text, "train")
    (resources,) = [line for line in train.splitlines() if line.strip().startswith("resources: ")]
    # The GPUs from the topology, the rest from the profile's set-resources: train and default-resources.
    for given in ("gpu=8", "gpu_manufacturer=nvidia", "mem_mb=512000", "cpus_per_task=64"):
        assert given in resources.split(", "), (given, resources)
    assert "Shell command: videogrpo stage train --config-json" in train  # no Job: the plugin's pod trains
    assert " --interconnect-env NCCL_DEBUG=WARN " in train  # the profile's, which the pod's launcher applies


def test_the_5b_recipes_job_is_sized_by_the_profile_and_runs_the_executors_image(s3_endpoint, tmp_path):
    """16 nodes: the train rule runs `videogrpo stage k8s-job` on the driver, handing over the image the plugin's
    pods run and the train rule's resources (profiles/kubernetes); its only config is the shared volume."""
    checkout = copy_checkout(tmp_path / "videogrpo")
    (checkout / "k8s.yaml").write_text(
        yaml.safe_dump({"kubernetes": {"volume_claim": "c", "volume_path": str(tmp_path)}})
    )
    recipe = ["--configfile", "config/recipes/rl_5b_cps.yaml", "k8s.yaml"]
    out = k8s_dry_run(checkout, s3_endpoint, *recipe, "--", "train")
    text = out.stdout + out.stderr
    (shell,) = [line for line in rule_block(text, "train").splitlines() if line.startswith("Shell command: ")]
    submit = shell.removeprefix("Shell command: ").partition(" -- ")[0]
    assert submit.startswith("videogrpo stage k8s-job --config-json @results/.stage-config/train-")
    pod = f"--image {IMAGE} --cpus 64 --mem-mb 512000 --shm-mb 65536 --gpu-manufacturer nvidia"
    pod += " --interconnect-env NCCL_DEBUG=WARN --apply"  # the profile's, into every pod's spec
    assert submit.endswith(pod), submit
    preflight = rule_block(text, "preflight")
    assert "gpu=1" in preflight and "gpu_manufacturer=nvidia" in preflight and "mem_mb=64000" in preflight


def test_the_module_imports_nothing_heavy():
    code = (
        "import sys, videogrpo.launch.k8s_job; "
        "print(sorted(m for m in ('torch', 'kubernetes', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # the Snakefile imports it: a dry run must not pay for them


def test_the_training_job_runs_as_the_executors_pods_do(tmp_path):
    """The Job's pods take the executor's flags and the train rule's resources, as the workflow hands them to
    `videogrpo stage k8s-job` (k8s_job.pod_arguments): nothing of them is a config field to keep in step."""
    import argparse
    from types import SimpleNamespace

    executor = SimpleNamespace(namespace="videogrpo", service_account_name="trainer", privileged=True)
    resources = {"cpus_per_task": 64, "mem_mb": 512000, "shm_mb": 65536, "gpu_manufacturer": "nvidia"}
    resources["machine_type"] = "p5.48xlarge"
    resources["interconnect_env"] = POD.interconnect_env
    parser = argparse.ArgumentParser()
    k8s_job.add_arguments(parser)
    given = ["--config-json", "{}", "--run-id", "x", "--spec", "s"]
    args = parser.parse_args([*given, *k8s_job.pod_arguments(IMAGE, executor, resources)])
    fields = [f.name for f in dataclasses.fields(k8s_job.PodSettings)]
    parsed = k8s_job.PodSettings(**{name: getattr(args, name) for name in fields})
    assert parsed == dataclasses.replace(POD, privileged=True)
    # A dry run has no executor settings: its command leaves them out rather than show defaults.
    assert k8s_job.pod_arguments(IMAGE, None, {"mem_mb": 1000, "machine_type": ""}) == [
        *("--image", IMAGE, "--mem-mb", "1000"),
    ]

    cfg = five_b(tmp_path)
    default_image = "snakemake/snakemake:v9.27.1"

    def found(executor="kubernetes", marked=True, image=IMAGE, of=cfg):
        return k8s_job.settings_problems(of, executor, marked, image, default_image)

    assert found() == [] and found("slurm", marked=False, image="") == []
    (unmarked,) = found(marked=False)
    assert "without profiles/kubernetes" in unmarked and "--profile profiles/kubernetes" in unmarked
    assert found(image=default_image) == [
        "--container-image = 'snakemake/snakemake:v9.27.1', Snakemake's own image: the training Job's pods run the "
        "image as it is, and it holds no environment of this checkout; give --container-image the image built "
        "from envs/"
    ]
    a14b = recipe("rl_a14b_rule")  # one plugin pod trains: no Job
    assert found(image=default_image, of=a14b) == []
    as_job = recipe("rl_a14b_rule", train_as_job=True, volume_claim="c", volume_path=str(tmp_path))
    assert k8s_job.problems(as_job, tmp_path) == [] and found(image=default_image, of=as_job)
    _, job = k8s_job.train_specs(as_job, "rl_a14b_rule-0123456789ab", ["videogrpo", "stage", "train"], tmp_path, POD)
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1, 1)
    k8s_job.validate([job])


def test_a_removed_kubernetes_field_is_refused_naming_its_new_home():
    for field, home in (
        ("image", "give --container-image"),
        ("namespace", "give --kubernetes-namespace"),
        ("gpu_manufacturer", "set gpu_manufacturer under default-resources of profiles/kubernetes/config.yaml"),
        ("cpus_per_node", "set cpus_per_task under set-resources: train of profiles/kubernetes/config.yaml"),
        ("train_retries", "set train.retries"),
    ):
        with pytest.raises(ConfigError, match=rf"kubernetes\.{field}: .*{re.escape(home)}"):
            config.from_dict({"kubernetes": {field: "x"}}, partial=True)
