"""Per-node preflight (docs/reference-system.md#memory): every decision over constructed facts, the real probe on this
machine, and the preflight-only switch end to end through `videogrpo train`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.parallel import process_groups
from videogrpo.preflight import checks as preflight
from videogrpo.preflight import node as node_preflight
from videogrpo.preflight.node import NodeFacts, decide

HOST = "gpu-node-07"


def hopper(**changes) -> NodeFacts:
    """An 8 x H200 node of the CUDA 13 environment on which every check passes."""
    base = NodeFacts(
        hostname=HOST,
        torch_version="2.13.0+cu130",
        torch_cuda="13.0",
        gloo_available=True,
        nccl_available=True,
        cuda_probed=True,
        cuda_available=True,
        device_count=8,
        device_names=("NVIDIA H200",) * 8,
        capabilities=((9, 0),) * 8,
        driver_version="580.95.05",
        driver_source="nvml",
        nccl_version="2.28.9",
        triton_version="3.7.1",
        triton_target="cuda:90",
        triton_compile="ok",
        triton_cache_files=5,
        triton_cache_fs="ext4",
        env={"TRITON_CACHE_DIR": "/tmp/u/triton-42", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    return dataclasses.replace(base, **changes)


def gpus(count: int, name: str = "NVIDIA H200", cap: tuple[int, int] = (9, 0)) -> dict:
    return {"device_count": count, "device_names": (name,) * count, "capabilities": (cap,) * count}


def cuda_checks(facts: NodeFacts, attention: str = "_flash_3_hub", backend: str = "nccl", needed: int = 8):
    return {c.name: c for c in decide(facts, "cuda", backend, attention, needed)}


def test_a_good_hopper_node_passes_every_check():
    checks = cuda_checks(hopper())
    assert list(checks) == [
        "process_group_backend",
        "devices",
        "nvidia_driver",
        "compute_capability",
        "nccl",
        "triton",
        "triton_cache",
        "cuda_alloc_conf",
    ]
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert "8 CUDA devices on gpu-node-07" in checks["devices"].detail
    assert "580.95.05 on gpu-node-07 (from nvml) >= 580.65.06" in checks["nvidia_driver"].detail
    assert "NCCL 2.28.9" in checks["nccl"].detail
    assert "cuda:90" in checks["triton"].detail and "5 files" in checks["triton"].detail
    line = node_preflight.summary(hopper(), "cuda")
    assert "8 x NVIDIA H200 (sm_90)" in line and "driver 580.95.05" in line and "compile ok" in line


# Each failing case: the facts changed, the check that fails, and what its message must name (the node, the
# number found, the number needed, the fix).
FAILURES = [
    (gpus(4), "devices", [HOST, "4 CUDA devices visible", "procs_per_node = 8", "--gres=gpu:N"]),
    (
        dict(gpus(0), cuda_available=False, env={"CUDA_VISIBLE_DEVICES": ""}),
        "devices",
        [HOST, "0 CUDA devices visible", "CUDA_VISIBLE_DEVICES=", "working NVIDIA driver"],
    ),
    (dict(torch_cuda=None, **gpus(0)), "devices", [HOST, "CPU-only build", "found 0", "8 needed", "make gpu-env"]),
    (
        dict(driver_version="570.133.20", cuda_available=False, **gpus(0)),
        "nvidia_driver",
        [HOST, "570.133.20", ">= 580.65.06", ">= 580 under CUDA minor-version", "upgrade the node's driver"],
    ),
    (
        dict(torch_cuda="12.6", driver_version="470.82.01", cuda_available=False, **gpus(0)),
        "nvidia_driver",
        ["470.82.01", ">= 560.28.03", ">= 525.60.13", "older CUDA"],
    ),
    (dict(driver_version=None, driver_source=""), "nvidia_driver", ["no NVIDIA driver found on gpu-node-07"]),
    (gpus(8, "NVIDIA A100-SXM4-80GB", (8, 0)), "compute_capability", [HOST, "sm_80", "Hopper (sm_90)", "'native'"]),
    (gpus(8, "NVIDIA B200", (10, 0)), "compute_capability", [HOST, "cuda:7 NVIDIA B200 sm_100", "set-resources"]),
    (dict(nccl_version=None), "nccl", [HOST, "found none", "parallel.backend = 'nccl'", "make gpu-env"]),
    (dict(nccl_available=False), "process_group_backend", [HOST, "'nccl' is not available", "make gpu-env"]),
    (dict(triton_version=None, triton_target=None, triton_compile=None), "triton", [HOST, "not installed"]),
    (
        dict(triton_target=None, triton_compile="get_current_target(): RuntimeError: 0 active drivers"),
        "triton",
        [HOST, "current target did not resolve", "0 active drivers"],
    ),
    (
        dict(triton_compile="CompilationError: ptxas fatal"),
        "triton",
        [HOST, "cuda:90", "ptxas fatal", "TRITON_CACHE_DIR = /tmp/u/triton-42"],
    ),
    (dict(triton_cache_fs="lustre"), "triton_cache", [HOST, "lustre", "node-local", "unset TRITON_CACHE_DIR"]),
]


@pytest.mark.parametrize("changes,name,needles", FAILURES, ids=[f"{f[1]}-{i}" for i, f in enumerate(FAILURES)])
def test_each_failure_names_the_node_the_numbers_and_the_fix(changes, name, needles):
    checks = cuda_checks(hopper(**changes))
    assert not checks[name].ok, checks[name]
    for needle in needles:
        assert needle in checks[name].detail, (needle, checks[name].detail)
    others = [c.name for c in checks.values() if not c.ok and c.name != name]
    assert others in ([], ["nccl"], ["devices"]), others  # a missing NCCL also fails the backend check


def test_without_a_device_the_device_checks_do_not_run():
    checks = cuda_checks(hopper(cuda_available=False, **gpus(0)))
    assert list(checks) == ["process_group_backend", "devices", "nvidia_driver"]


def test_a_failed_probe_is_the_one_finding():
    checks = decide(hopper(probe_error="python -m videogrpo.preflight.node exited -11: ..."), "cuda", "nccl", "x", 8)
    assert [(c.name, c.ok) for c in checks] == [("devices", False)]
    assert "gpu-node-07: probing the node failed: python -m videogrpo.preflight.node exited -11" in checks[0].detail


@pytest.mark.parametrize(
    "cuda,driver,available,needle",
    [
        ("12.6", "560.28.03", True, ">= 560.28.03, CUDA 12.6's minimum"),
        ("12.6", "535.104.05", True, "minor-version compatibility (native support needs >= 560.28.03"),
        ("12.8", "570.124.06", True, ">= 570.26"),  # 124 > 26: numbers, not strings
        ("13.0", "575.51.03", True, "forward-compatibility"),  # below 580, yet CUDA initialised
        ("13.9", "600.10", True, "not in the table"),
    ],
)
def test_driver_rules_follow_nvidias_tables(cuda, driver, available, needle):
    check = node_preflight.check_driver(hopper(torch_cuda=cuda, driver_version=driver, cuda_available=available))
    assert check.ok and needle in check.detail, check


def test_version_comparison_is_numeric():
    assert node_preflight.at_least("570.124.06", "570.26")
    assert node_preflight.at_least("525.60.13", "525.60.13")
    assert not node_preflight.at_least("525.60.12", "525.60.13")
    assert node_preflight.at_least("580.65.06", "580") and not node_preflight.at_least("575.64", "580")


def test_attention_backends_without_a_gpu_generation_need_none():
    assert cuda_checks(hopper(**gpus(8, "NVIDIA A100", (8, 0))), attention="native")["compute_capability"].ok
    fa2 = cuda_checks(hopper(**gpus(8, "Tesla V100", (7, 0))), attention="flash_hub")["compute_capability"]
    assert not fa2.ok and "Ampere or newer (sm_80+)" in fa2.detail and "sm_70" in fa2.detail


def test_gloo_on_cuda_skips_the_nccl_check_and_a_users_alloc_conf_is_reported():
    facts = hopper(env={"TRITON_CACHE_DIR": "/tmp/x", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"})
    checks = cuda_checks(facts, backend="gloo")
    assert "nccl" not in checks and all(c.ok for c in checks.values())
    assert "'max_split_size_mb:512' as set by the user" in checks["cuda_alloc_conf"].detail


def test_cpu_configs_skip_the_cuda_checks_saying_so():
    facts = NodeFacts(hostname="laptop", torch_version="2.13.0+cpu", torch_cuda=None, gloo_available=True,
                      nccl_available=False)  # fmt: skip
    checks = decide(facts, "cpu", "gloo", "native", 2)
    assert [(c.name, c.ok) for c in checks] == [("process_group_backend", True), ("devices", True)]
    assert "CUDA checks skipped (devices, driver, compute capability, NCCL, Triton)" in checks[1].detail
    assert "CUDA checks skipped" in node_preflight.summary(facts, "cpu")


def test_driver_version_from_proc_in_both_kernel_module_formats():
    closed = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version: gcc"
    )
    opened = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16)"
    assert node_preflight.parse_proc_driver_version(closed) == "535.104.05"
    assert node_preflight.parse_proc_driver_version(opened) == "570.133.20"
    assert node_preflight.parse_proc_driver_version("no module here") is None


def test_the_filesystem_of_a_path_is_its_longest_mount_point():
    mounts = "\n".join(
        [
            "/dev/nvme0n1p2 / ext4 rw,relatime 0 0",
            "tmpfs /tmp tmpfs rw,nosuid 0 0",
            "storage:/export/home /home nfs4 rw,relatime 0 0",
            "10.0.0.5@o2ib:/scratch /scratch lustre rw 0 0",
            "/dev/sdb1 /mnt/local\\040disk xfs rw 0 0",
        ]
    )
    assert node_preflight.filesystem_of("/tmp/u/triton-1", mounts) == "tmpfs"
    assert node_preflight.filesystem_of("/home/u/.triton", mounts) == "nfs4"
    assert node_preflight.filesystem_of("/scratch/u/triton", mounts) == "lustre"
    assert node_preflight.filesystem_of("/mnt/local disk/t", mounts) == "xfs"
    assert node_preflight.filesystem_of("/homework/x", mounts) == "ext4"  # /home is no prefix of /homework


def test_the_launcher_environment_puts_triton_on_node_local_disk_unless_set():
    slurm = node_preflight.node_env({"SLURM_JOB_ID": "4242", "TMPDIR": "/local/job4242", "USER": "ana"}, uid=1000)
    assert slurm == {"TRITON_CACHE_DIR": "/local/job4242/triton-4242", "PYTORCH_CUDA_ALLOC_CONF": ALLOC}
    plain = node_preflight.node_env({"USER": "ana"}, uid=1000)
    assert plain["TRITON_CACHE_DIR"] == "/tmp/ana/triton"
    assert node_preflight.node_env({}, uid=1000)["TRITON_CACHE_DIR"] == "/tmp/1000/triton"
    mine = {"TRITON_CACHE_DIR": "/nvme/t", "PYTORCH_ALLOC_CONF": "expandable_segments:False"}
    assert node_preflight.node_env(mine, uid=1000) == {}


ALLOC = "expandable_segments:True"


@pytest.mark.parametrize(
    "flag,value,expected",
    [(False, None, False), (True, None, True), (False, "1", True), (False, "true", True), (True, "0", True),
     (False, "0", False), (False, "", False)],
)  # fmt: skip
def test_the_preflight_only_switch_is_the_flag_or_the_references_variable(flag, value, expected):
    env = {} if value is None else {node_preflight.PREFLIGHT_ONLY_VAR: value}
    assert node_preflight.preflight_only(flag, env) is expected


def test_a_bad_switch_value_names_the_variable():
    with pytest.raises(ConfigError, match="WAN_TRAINER_TRITON_PREFLIGHT_ONLY='maybe': set it to 1"):
        node_preflight.preflight_only(False, {node_preflight.PREFLIGHT_ONLY_VAR: "maybe"})


def test_node_checks_decide_from_given_facts_and_add_backend_and_port():
    cfg = config.from_dict(
        {"parallel": {"procs_per_node": 8, "device": "cuda", "backend": "nccl", "attention_backend": "native"}},
        partial=True,
    )
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        checks = {c.name: c for c in preflight.node_checks(cfg, port=port, facts=hopper())}
    assert checks["attention_backend"].ok and checks["compute_capability"].ok
    assert not checks["rendezvous_port"].ok and f"port {port}" in checks["rendezvous_port"].detail
    one = {c.name: c for c in preflight.node_checks(cfg, devices=1, facts=hopper(**gpus(1)))}
    assert one["devices"].ok  # the preflight stage's job holds one GPU


CUDA_HERE = (
    subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    ).stdout.strip()
    == "True"
)


@pytest.mark.skipif(CUDA_HERE, reason="this machine has CUDA: the no-CUDA report is for machines without it")
def test_the_real_probe_reports_no_cuda_cleanly_on_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cache = tmp_path / "node-local" / "triton-1"
    facts = node_preflight.probe("cuda", dict(os.environ, TRITON_CACHE_DIR=str(cache)))
    assert cache.is_dir()  # made by the launcher's probe, before any worker compiles into it
    assert facts.env["TRITON_CACHE_DIR"] == str(cache) and facts.triton_cache_fs
    assert facts.probe_error is None and facts.cuda_probed and facts.hostname == socket.gethostname()
    assert facts.device_count == 0 and not facts.cuda_available and facts.triton_compile is None
    assert facts.env["CUDA_VISIBLE_DEVICES"] == ""
    checks = {c.name: c for c in decide(facts, "cuda", "gloo", "native", 2)}
    assert not checks["devices"].ok and socket.gethostname() in checks["devices"].detail
    assert "0 CUDA devices" in checks["devices"].detail and "2 needed" in checks["devices"].detail
    cpu = node_preflight.probe("cpu")
    assert not cpu.cuda_probed and cpu.device_count == 0 and cpu.driver_version is None


def test_the_process_group_waits_240_minutes_as_the_reference(monkeypatch):
    seen = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(process_groups.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(process_groups.dist, "init_process_group", lambda **kw: seen.update(kw))
    process_groups.init("cpu", "gloo", 1)
    assert seen["timeout"] == datetime.timedelta(minutes=240) and seen["backend"] == "gloo"


# --- the preflight-only switch end to end ---------------------------------------------------------------

CPU_GLOO = {
    "parallel": {"nodes": 1, "procs_per_node": 2, "device": "cpu", "backend": "gloo", "attention_backend": "native"}
}


def videogrpo_train(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "videogrpo.cli", "stage", "train", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **(env or {})), timeout=600)


def assert_no_training(run: subprocess.CompletedProcess, tmp_path: Path) -> None:
    output = run.stdout + run.stderr
    for sign in ("[rank", "torch.distributed.run", "[train]", "checkpoints in"):
        assert sign not in output, output
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_preflight_only_runs_the_node_checks_and_exits_without_torchrun(tmp_path):
    run = videogrpo_train("--preflight-only", "--config-json", json.dumps(CPU_GLOO))
    assert run.returncode == 0, run.stderr
    host = socket.gethostname()
    assert run.stdout.strip().splitlines() == [
        f"[preflight] node 0/1 {host}: ok: CPU, torch {torch_version()} (CUDA checks skipped: parallel.device = cpu)"
    ]
    assert "[launch] [ok] process_group_backend: gloo available" in run.stderr
    assert "[launch] [ok] devices: CPU on" in run.stderr and "CUDA checks skipped" in run.stderr
    assert_no_training(run, tmp_path)


def test_the_references_variable_turns_the_training_command_into_a_preflight(tmp_path):
    """The rule's full command with WAN_TRAINER_TRITON_PREFLIGHT_ONLY=1: checks, no outputs, no manifest."""
    paths = {n: str(tmp_path / n) for n in ("run", "model", "dataset", "preflight.json", "final", "metrics.jsonl")}
    args = ["--config-json", json.dumps(CPU_GLOO), "--run-id", "r", "--run-dir", paths["run"]]
    args += ["--model", paths["model"], "--dataset", paths["dataset"], "--preflight", paths["preflight.json"]]
    args += ["--final", paths["final"], "--metrics", paths["metrics.jsonl"]]
    args += ["--manifest", str(tmp_path / "train.manifest.json")]
    run = videogrpo_train(*args, env={node_preflight.PREFLIGHT_ONLY_VAR: "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"[preflight] node 0/1 {socket.gethostname()}: ok")
    assert_no_training(run, tmp_path)


@pytest.mark.skipif(CUDA_HERE, reason="this machine has CUDA")
def test_preflight_only_of_a_cuda_config_on_this_machine_fails_naming_the_node(tmp_path):
    parallel = {"nodes": 2, "procs_per_node": 8, "device": "cuda", "backend": "gloo", "attention_backend": "native"}
    cuda = {"parallel": parallel}
    run = videogrpo_train("--preflight-only", "--config-json", json.dumps(cuda))
    assert run.returncode == 1, run.stderr
    host = socket.gethostname()
    assert run.stdout.startswith(f"[preflight] node 0/1 {host}: FAIL (devices)"), run.stdout
    assert f"[launch] [FAIL] devices: no CUDA on {host}" in run.stderr or f"visible on {host}" in run.stderr
    assert_no_training(run, tmp_path)


def test_training_without_its_arguments_names_them():
    run = videogrpo_train("--config-json", json.dumps(CPU_GLOO))
    assert run.returncode == 2
    assert "--manifest, --run-id, --run-dir, --model, --dataset, --preflight, --final, --metrics required" in run.stderr


def torch_version() -> str:
    import torch

    return torch.__version__


def test_a_triton_cache_that_cannot_be_made_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    facts = node_preflight.probe("cuda", dict(os.environ, TRITON_CACHE_DIR=str(blocker / "triton")))
    check = decide(facts, "cuda", "nccl", "native", 1)[0]
    assert not check.ok and f"TRITON_CACHE_DIR = {blocker / 'triton'} cannot be made" in check.detail


SRUN = """#!/bin/bash
# Stand-in for srun inside an allocation: one task per node, each with the variables srun gives its task,
# in turn; the exit status is the highest of the tasks' (as srun's without --kill-on-bad-exit).
printf '%s\n' "$@" > "$SRUN_ARGV"
nodes=1
while [[ $1 == --* ]]; do
  case $1 in --nodes=*) nodes=${1#--nodes=} ;; esac
  shift
done
status=0
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_NNODES=$nodes SLURM_LAUNCH_NODE_IPADDR=127.0.0.1 "$@"
  code=$?
  ((code > status)) && status=$code
done
exit $status
"""


def test_preflight_only_in_an_allocation_reports_every_node_and_fails_if_one_does(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "srun").chmod(0o755)
    with socket.socket() as held:  # node 0's rendezvous port, taken: node 0 fails, node 1 passes
        held.bind(("", 0))
        held.listen()
        env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SLURM_JOB_ID": "99",
            "SLURM_JOB_NUM_NODES": "2",
            "MASTER_PORT": str(held.getsockname()[1]),
            "SRUN_ARGV": str(tmp_path / "argv"),
        }
        run = videogrpo_train("--preflight-only", "--config-json", json.dumps(CPU_GLOO), env=env)
    assert run.returncode == 1, run.stderr
    srun_args = (tmp_path / "argv").read_text().splitlines()
    assert srun_args[:4] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpu-bind=none"]
    assert srun_args[5:10] == [sys.executable, "-m", "videogrpo.cli", "stage", "train"] and "--node-only" in srun_args
    assert "--kill-on-bad-exit=1" not in srun_args and srun_args[-3:] == [
        "--preflight-only",
        "--config-json",
        json.dumps(CPU_GLOO),
    ]
    lines = run.stdout.strip().splitlines()
    host = socket.gethostname()
    assert lines[0].startswith(f"[preflight] node 0/2 {host}: FAIL (rendezvous_port): CPU")
    assert lines[1].startswith(f"[preflight] node 1/2 {host}: ok: CPU")
    assert lines[2] == (
        "[preflight] NOT all of the allocation's 2 nodes passed (srun exited 1): the FAIL lines above name the "
        "nodes and the fixes"
    )
    assert f"[launch] [FAIL] rendezvous_port: port {env['MASTER_PORT']} on {host} is in use" in run.stderr


def test_facts_cross_the_process_boundary_unchanged():
    facts = hopper(probe_error=None, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert NodeFacts.from_json(json.loads(json.dumps(dataclasses.asdict(facts)))) == facts


def test_the_cuda_branch_of_the_probe_reads_what_torch_reports(monkeypatch):
    """No GPU here: torch's CUDA queries answer as on a 2 x H100 node, to run the probe's own code path."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(node_preflight, "read_driver_version", lambda: ("560.35.03", "nvidia-smi"))
    facts = node_preflight.probe_here(cuda=True)
    assert (facts.device_count, facts.capabilities, facts.nccl_version) == (2, ((9, 0), (9, 0)), "2.27.3")
    assert facts.driver_version == "560.35.03" and facts.torch_cuda == "12.6"
    checks = {c.name: c for c in decide(facts, "cuda", "nccl", "_flash_3_hub", 2)}
    assert checks["devices"].ok and checks["compute_capability"].ok and checks["nccl"].ok
    assert checks["nvidia_driver"].ok and ">= 560.28.03" in checks["nvidia_driver"].detail
    assert not checks["triton"].ok and "triton is not installed" in checks["triton"].detail  # none in this env
