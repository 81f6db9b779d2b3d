"""Per-node preflight: what every machine of a training job must have before torchrun starts there.

docs/reference-system.md#memory: the runtime check and a Triton compiler check on each node, `TRITON_CACHE_DIR` on
node-local disk, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, and a switch that runs only these
checks and exits (`WAN_TRAINER_TRITON_PREFLIGHT_ONLY`, or `videogrpo stage train --preflight-only`).

The node's facts are gathered once, by `probe`, into a `NodeFacts`; every decision is a pure function of
those facts (`decide`), so that tests cover each passing and failing case with constructed facts on a
machine without a GPU. For a CUDA config the probe runs in a child process: initialising CUDA and
running the Triton kernel create a CUDA context, which the launcher (alive for the whole run, beside
its torchrun) must not hold on the first GPU. For a CPU config CUDA is left alone and its checks are
skipped, saying so.

Each failure names the node (its hostname), what was found, what is needed and the fix.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from videogrpo.errors import ConfigError

PREFLIGHT_ONLY_VAR = "WAN_TRAINER_TRITON_PREFLIGHT_ONLY"
ALLOC_CONF = "expandable_segments:True"
PROBE_TIMEOUT_S = 300
# The environment the report shows: what decides which GPUs a process sees and where Triton writes.
REPORTED_ENV = ("CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TMPDIR")

# Minimum Linux x86_64 driver of each CUDA minor release at its GA, from NVIDIA's CUDA Toolkit Release
# Notes, section "CUDA Driver", Table 3 "CUDA Toolkit and Corresponding Driver Versions"
# (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#cuda-driver). torch.version.cuda
# names the minor release only ("12.6"), so its GA row is the one that applies.
NATIVE_DRIVER = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    "13.1": "590.44.01",
    "13.2": "595.45.04",
}
# CUDA minor-version compatibility: a driver of the major's family from this version on runs every minor
# release of that major, with a limited feature set (no JIT of PTX newer than the driver). Same page,
# Table 2 "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility"
# (12.x: >= 525.60.13 as the 12.x release notes give it; 13.x: >= 580), and for 11.x the footnote's
# 450.80.02; https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html.
COMPAT_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580"}

# Attention backends built for some GPU generations only: (lowest, first excluded) compute capability.
# FlashAttention-3's kernels (and the Hub kernel the recipes load) are Hopper-only, sm_90; FlashAttention-2
# needs Ampere or newer. diffusers checks neither before the first forward pass.
BACKEND_CAPABILITY = {
    "_flash_3": ((9, 0), (10, 0), "Hopper (sm_90)"),
    "_flash_varlen_3": ((9, 0), (10, 0), "Hopper (sm_90)"),
    "_flash_3_hub": ((9, 0), (10, 0), "Hopper (sm_90)"),
    "_flash_3_varlen_hub": ((9, 0), (10, 0), "Hopper (sm_90)"),
    "_sage_qk_int8_pv_fp8_cuda_sm90": ((9, 0), (10, 0), "Hopper (sm_90)"),
    "flash": ((8, 0), None, "Ampere or newer (sm_80+)"),
    "flash_varlen": ((8, 0), None, "Ampere or newer (sm_80+)"),
    "flash_hub": ((8, 0), None, "Ampere or newer (sm_80+)"),
    "flash_varlen_hub": ((8, 0), None, "Ampere or newer (sm_80+)"),
}
# Shared filesystems: a Triton cache there is written by every rank of every node at once.
NETWORK_FILESYSTEMS = frozenset(
    "nfs nfs4 lustre gpfs beegfs cifs smb3 ceph glusterfs fuse.glusterfs fuse.sshfs wekafs panfs 9p".split()
)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class NodeFacts:
    """What one machine has, as probed; every field a plain value, so it crosses a process as JSON."""

    hostname: str
    torch_version: str
    torch_cuda: str | None
    """torch.version.cuda: the CUDA release torch was built for; None for a CPU-only build."""
    gloo_available: bool
    nccl_available: bool
    cuda_probed: bool = False
    """False for a CPU config: CUDA was not touched and its facts are empty."""
    cuda_available: bool = False
    device_count: int = 0
    device_names: tuple[str, ...] = ()
    capabilities: tuple[tuple[int, int], ...] = ()
    driver_version: str | None = None
    driver_source: str = ""
    """Where the driver version came from: nvml, nvidia-smi or /proc/driver/nvidia/version."""
    nccl_version: str | None = None
    triton_version: str | None = None
    triton_target: str | None = None
    triton_compile: str | None = None
    """"ok", or what failed; None when no compile was tried."""
    triton_cache_files: int = 0
    triton_cache_fs: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    probe_error: str | None = None

    @classmethod
    def from_json(cls, data: dict) -> NodeFacts:
        data = dict(data)
        data["device_names"] = tuple(data.get("device_names", ()))
        data["capabilities"] = tuple(tuple(c) for c in data.get("capabilities", ()))
        return cls(**data)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def at_least(found: str, needed: str) -> bool:
    a, b = version_tuple(found), version_tuple(needed)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) >= b + (0,) * (width - len(b))


def parse_proc_driver_version(text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
    535.104.05 ..." or "... Open Kernel Module for x86_64  560.35.03 ...")."""
    match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def filesystem_of(path: str, mounts: str) -> str | None:
    """The type of the filesystem holding `path`, from the text of /proc/mounts (longest mount point wins)."""
    target = os.path.realpath(path)  # a symlinked cache lives where its target does
    best, kind = "", None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def triton_cache_dir(env: dict[str, str], uid: int) -> str:
    """Node-local disk for Triton's kernel cache: $TMPDIR (often per job and node-local under SLURM) or
    /tmp/<user>, in a folder per SLURM job, so that no rank compiles into a shared filesystem."""
    job = env.get("SLURM_JOB_ID")
    name = f"triton-{job}" if job else "triton"
    if env.get("TMPDIR"):
        return str(Path(env["TMPDIR"]) / name)
    user = env.get("USER") or env.get("LOGNAME") or str(uid)
    return str(Path("/tmp") / user / name)


def node_env(env: dict[str, str], uid: int | None = None) -> dict[str, str]:
    """The variables the launcher adds for the probe and the workers, each only where the user has not set it."""
    added = {}
    if not env.get("TRITON_CACHE_DIR"):
        added["TRITON_CACHE_DIR"] = triton_cache_dir(env, os.getuid() if uid is None else uid)
    if not env.get("PYTORCH_CUDA_ALLOC_CONF") and not env.get("PYTORCH_ALLOC_CONF"):
        added["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF
    return added


def preflight_only(flag: bool, env: dict[str, str] | None = None) -> bool:
    """The preflight-only switch: the CLI flag, or the reference's environment variable."""
    value = (os.environ if env is None else env).get(PREFLIGHT_ONLY_VAR, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return flag
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{PREFLIGHT_ONLY_VAR}={value!r}: set it to 1 (run only the per-node preflight) or 0")


# --- decisions: pure functions of the facts -------------------------------------------------------------


def check_backend(f: NodeFacts, backend: str) -> Check:
    available = f.gloo_available if backend == "gloo" else f.nccl_available
    if not available:
        return Check(
            "process_group_backend",
            False,
            f"{f.hostname}: parallel.backend = {backend!r} is not available in torch {f.torch_version}; "
            f"install the training environment's torch (make gpu-env) or choose another backend",
        )
    return Check("process_group_backend", True, f"{backend} available in torch {f.torch_version}")


def check_devices(f: NodeFacts, needed: int) -> Check:
    if f.probe_error:
        return Check("devices", False, f"{f.hostname}: probing the node failed: {f.probe_error}")
    visible = f.env.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    if f.torch_cuda is None:
        return Check(
            "devices",
            False,
            f"no CUDA on {f.hostname}: torch {f.torch_version} is a CPU-only build (torch.version.cuda is None); "
            f"found 0 CUDA devices, {needed} needed (parallel.procs_per_node); run in the GPU environment "
            f"(make gpu-env) or set parallel.device = cpu",
        )
    if f.device_count < needed:
        fix = (
            "the job asks for one GPU per process (--gres=gpu:N): run on nodes that have them (the partition or "
            "constraint under set-resources of profiles/slurm/config.yaml), check CUDA_VISIBLE_DEVICES, "
            "or lower parallel.procs_per_node"
        )
        if f.device_count == 0:
            fix = "run on a GPU node with a working NVIDIA driver (the driver check says more), or " + fix
        return Check(
            "devices",
            False,
            f"{f.device_count} CUDA devices visible on {f.hostname}{where}, parallel.procs_per_node = {needed} "
            f"needed; {fix}",
        )
    names = sorted(set(f.device_names))
    return Check("devices", True, f"{f.device_count} CUDA devices on {f.hostname}{where}: {', '.join(names)}")


def check_driver(f: NodeFacts) -> Check:
    """The NVIDIA driver against the minimum of the CUDA release torch was built for (NVIDIA's tables above)."""
    cuda = f.torch_cuda
    if cuda is None:
        return Check("nvidia_driver", True, "torch is a CPU-only build: no driver needed (the devices check fails)")
    major = version_tuple(cuda)[0]
    compat = COMPAT_DRIVER.get(major)
    native = NATIVE_DRIVER.get(".".join(str(p) for p in version_tuple(cuda)[:2]))
    need = f">= {native}" if native else f"the CUDA {major}.x family's driver"
    if compat:
        need += f" (>= {compat} under CUDA minor-version compatibility)"
    if f.driver_version is None:
        return Check(
            "nvidia_driver",
            False,
            f"no NVIDIA driver found on {f.hostname} (NVML, nvidia-smi, /proc/driver/nvidia/version); torch "
            f"{f.torch_version} (CUDA {cuda}) needs {need}; run on a GPU node with the NVIDIA driver loaded",
        )
    found = f"driver {f.driver_version} on {f.hostname} (from {f.driver_source})"
    if compat and not at_least(f.driver_version, compat):
        if f.cuda_available:
            # A driver below the family's minimum that still runs CUDA: the forward-compatibility package.
            return Check(
                "nvidia_driver",
                True,
                f"{found} is below {need} for CUDA {cuda}, yet CUDA initialised: the CUDA forward-compatibility "
                f"package (cuda-compat) serves it",
            )
        return Check(
            "nvidia_driver",
            False,
            f"{found} is too old for torch {f.torch_version} built for CUDA {cuda}: needs {need}; upgrade the "
            f"node's driver, or install a torch built for an older CUDA (docs/gpus.md: a CUDA 12.x build from "
            f"PyTorch's own index)",
        )
    if native and not at_least(f.driver_version, native):
        return Check(
            "nvidia_driver",
            True,
            f"{found} runs CUDA {cuda} under minor-version compatibility (native support needs >= {native}; "
            f"PTX newer than the driver cannot be JIT-compiled)",
        )
    if native is None:
        return Check("nvidia_driver", True, f"{found}; CUDA {cuda} is not in the table (>= {compat} for {major}.x)")
    return Check("nvidia_driver", True, f"{found} >= {native}, CUDA {cuda}'s minimum")


def check_capability(f: NodeFacts, attention_backend: str) -> Check:
    need = BACKEND_CAPABILITY.get(attention_backend)
    found = ", ".join(sorted({f"sm_{a}{b}" for a, b in f.capabilities})) or "none"
    if need is None:
        return Check(
            "compute_capability", True, f"{found}; parallel.attention_backend = {attention_backend!r} needs none"
        )
    low, high, label = need
    bad = [
        f"cuda:{i} {name} sm_{cap[0]}{cap[1]}"
        for i, (name, cap) in enumerate(zip(f.device_names, f.capabilities, strict=False))
        if cap < low or (high is not None and cap >= high)
    ]
    if bad:
        return Check(
            "compute_capability",
            False,
            f"parallel.attention_backend = {attention_backend!r} needs {label} but {f.hostname} has {', '.join(bad)}; "
            f"run on such GPUs (constraint under set-resources of profiles/slurm/config.yaml) or choose another "
            f"backend ('native' runs everywhere)",
        )
    return Check("compute_capability", True, f"{found} on {f.hostname}, as {attention_backend} needs ({label})")


def check_nccl(f: NodeFacts) -> Check:
    if not f.nccl_available or not f.nccl_version:
        return Check(
            "nccl",
            False,
            f"no NCCL in torch {f.torch_version} on {f.hostname} (found none, parallel.backend = 'nccl' needs it); "
            f"install the training environment's CUDA torch (make gpu-env)",
        )
    return Check("nccl", True, f"NCCL {f.nccl_version} (the reference locks 2.28)")


def check_triton(f: NodeFacts) -> Check:
    if f.triton_version is None:
        return Check(
            "triton",
            False,
            f"triton is not installed on {f.hostname} (found none, torch.compile and the fused kernels need it); "
            f"install the training environment (make gpu-env)",
        )
    if not f.triton_target:
        return Check(
            "triton",
            False,
            f"triton {f.triton_version} on {f.hostname}: the active driver's current target did not resolve "
            f"({f.triton_compile}); check that triton matches torch (the lock pins both) and the driver",
        )
    if f.triton_compile != "ok":
        return Check(
            "triton",
            False,
            f"triton {f.triton_version} on {f.hostname}, target {f.triton_target}: the test kernel failed "
            f"({f.triton_compile}); check the driver and that TRITON_CACHE_DIR = {f.env.get('TRITON_CACHE_DIR')} "
            f"is writable",
        )
    return Check(
        "triton",
        True,
        f"triton {f.triton_version}, target {f.triton_target}: a test kernel compiled and ran "
        f"({f.triton_cache_files} files in TRITON_CACHE_DIR)",
    )


def check_triton_cache(f: NodeFacts) -> Check:
    path = f.env.get("TRITON_CACHE_DIR")
    if not path:
        return Check("triton_cache", False, f"{f.hostname}: TRITON_CACHE_DIR unset; the launcher sets it (a bug)")
    if f.triton_cache_fs in NETWORK_FILESYSTEMS:
        return Check(
            "triton_cache",
            False,
            f"TRITON_CACHE_DIR = {path} on {f.hostname} is on {f.triton_cache_fs}, a shared filesystem; node-local "
            f"disk needed; unset TRITON_CACHE_DIR (the launcher then uses $TMPDIR or /tmp/<user>) or point it "
            f"at node-local disk",
        )
    return Check("triton_cache", True, f"TRITON_CACHE_DIR = {path} ({f.triton_cache_fs or 'filesystem unknown'})")


def check_alloc_conf(f: NodeFacts) -> Check:
    conf = f.env.get("PYTORCH_CUDA_ALLOC_CONF") or f.env.get("PYTORCH_ALLOC_CONF") or ""
    if "expandable_segments:true" in conf.replace(" ", "").lower():
        return Check("cuda_alloc_conf", True, f"PYTORCH_CUDA_ALLOC_CONF={conf} as the reference")
    return Check("cuda_alloc_conf", True, f"allocator config {conf!r} as set by the user (the reference: {ALLOC_CONF})")


def decide(f: NodeFacts, device: str, backend: str, attention_backend: str, devices_needed: int) -> list[Check]:
    """Every node check, from the facts alone."""
    if device == "cuda" and f.probe_error:
        return [check_devices(f, devices_needed)]  # the probe's failure is the finding; nothing else was seen
    checks = [check_backend(f, backend)]
    if device != "cuda":
        return checks + [
            Check(
                "devices",
                True,
                f"CPU on {f.hostname} (parallel.device = {device}): CUDA checks skipped (devices, driver, compute "
                f"capability, NCCL, Triton)",
            )
        ]
    checks += [check_devices(f, devices_needed), check_driver(f)]
    if f.device_count == 0:
        return checks  # capability, NCCL and Triton need a device: the devices check says why there is none
    checks.append(check_capability(f, attention_backend))
    if backend == "nccl":
        checks.append(check_nccl(f))
    checks += [check_triton(f), check_triton_cache(f), check_alloc_conf(f)]
    return checks


def summary(f: NodeFacts, device: str) -> str:
    """One line of what the node has, for the per-node report."""
    if device != "cuda":
        return f"CPU, torch {f.torch_version} (CUDA checks skipped: parallel.device = {device})"
    if f.probe_error:
        return f"probe failed: {f.probe_error}"
    if f.device_count == 0:
        build = f"CUDA {f.torch_cuda}" if f.torch_cuda else "a CPU-only build"
        return f"no CUDA device, torch {f.torch_version} ({build}), driver {f.driver_version or 'not found'}"
    caps = "/".join(sorted({f"sm_{a}{b}" for a, b in f.capabilities}))
    names = "/".join(sorted(set(f.device_names)))
    return (
        f"{f.device_count} x {names} ({caps}), driver {f.driver_version}, torch {f.torch_version} "
        f"(CUDA {f.torch_cuda}), NCCL {f.nccl_version}, triton {f.triton_version} "
        f"{f.triton_target} compile {f.triton_compile}"
    )


# --- the probe ------------------------------------------------------------------------------------------


def read_driver_version() -> tuple[str | None, str]:
    """The NVIDIA driver version: NVML (pynvml) if installed, else nvidia-smi, else /proc/driver/nvidia/version."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return (version.decode() if isinstance(version, bytes) else str(version)), "nvml"
    except Exception:  # not installed, or no driver behind it: the next source says
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and lines:
            return lines[0], "nvidia-smi"
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        version = parse_proc_driver_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        version = None
    return version, "/proc/driver/nvidia/version" if version else ""


def _triton_facts() -> dict:
    """Triton's version, the active driver's current target, and a test kernel compiled and run."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return {}
    import triton

    facts: dict = {"triton_version": triton.__version__}
    try:
        target = triton.runtime.driver.active.get_current_target()
        facts["triton_target"] = f"{target.backend}:{target.arch}"
    except Exception as err:  # what failed is the finding
        facts["triton_compile"] = f"get_current_target(): {type(err).__name__}: {err}"
        return facts
    try:
        from videogrpo.preflight.triton_check import run_test_kernel

        facts["triton_compile"] = run_test_kernel()
    except Exception as err:
        facts["triton_compile"] = f"{type(err).__name__}: {err}"
    cache = os.environ.get("TRITON_CACHE_DIR")
    if cache and Path(cache).is_dir():
        facts["triton_cache_files"] = sum(1 for p in Path(cache).rglob("*") if p.is_file())
    return facts


def probe_here(cuda: bool) -> NodeFacts:
    """This process's facts; with `cuda`, CUDA is initialised and the Triton test kernel runs."""
    import torch
    import torch.distributed as dist

    facts: dict = {
        "hostname": socket.gethostname(),
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "cuda_probed": cuda,
        "env": {k: os.environ[k] for k in REPORTED_ENV if k in os.environ},
    }
    if not cuda:
        return NodeFacts(**facts)
    facts["driver_version"], facts["driver_source"] = read_driver_version()
    cache = os.environ.get("TRITON_CACHE_DIR")
    if cache:
        try:
            facts["triton_cache_fs"] = filesystem_of(cache, Path("/proc/mounts").read_text())
        except OSError:
            pass
    if torch.version.cuda is None:
        return NodeFacts(**facts)
    facts["cuda_available"] = torch.cuda.is_available()
    facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
    facts["device_names"] = tuple(torch.cuda.get_device_name(i) for i in range(facts["device_count"]))
    facts["capabilities"] = tuple(torch.cuda.get_device_capability(i) for i in range(facts["device_count"]))
    if facts["nccl_available"]:
        try:
            facts["nccl_version"] = ".".join(str(p) for p in torch.cuda.nccl.version())
        except Exception:  # a torch without NCCL bindings: nccl_version stays None, the check says so
            pass
    if facts["device_count"]:
        facts.update(_triton_facts())
    return NodeFacts(**facts)


def probe(device: str, env: dict[str, str] | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> NodeFacts:
    """The node's facts. CUDA configs: in a child process under `env` (the workers' environment)."""
    if device != "cuda":
        return probe_here(cuda=False)
    import torch

    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", "videogrpo.preflight.node"]
    host = socket.gethostname()

    failed = {
        "hostname": host,
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gloo_available": False,
        "nccl_available": False,
        "cuda_probed": True,
    }
    cache = env.get("TRITON_CACHE_DIR")
    try:
        if cache:
            Path(cache).mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        return NodeFacts(**failed, probe_error=f"TRITON_CACHE_DIR = {cache} cannot be made ({err}); point it elsewhere")
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return NodeFacts(**failed, probe_error=f"{' '.join(argv)} ran past {timeout_s:g} s (a hung driver?)")
    marked = [line for line in out.stdout.splitlines() if line.startswith("NODE_FACTS ")]
    if out.returncode != 0 or not marked:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return NodeFacts(**failed, probe_error=f"{' '.join(argv)} exited {out.returncode}: {tail}")
    return NodeFacts.from_json(json.loads(marked[-1].removeprefix("NODE_FACTS ")))


def main() -> int:
    print("NODE_FACTS " + json.dumps(asdict(probe_here(cuda=True))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
