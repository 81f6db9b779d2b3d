"""The GPU environment's locks resolve for Linux x86_64 on Python 3.11 and 3.12, from the registry,
without downloading wheels, and agree with the CPU environment.

Needs the package registry (CI has it): unreachable, the test fails, it does not skip.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import doc_commands
import pytest

REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / "envs"


def load_locker():
    spec = importlib.util.spec_from_file_location("lock_gpu", ENVS / "lock_gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lock_gpu"] = module
    spec.loader.exec_module(module)
    return module


L = load_locker()


@pytest.fixture(scope="module")
def locks():
    base, sdist_only = L.read_lock(L.GPU_LOCK)
    liger, liger_sdist = L.read_lock(L.LIGER_LOCK)
    assert not liger_sdist
    return base, sdist_only, liger


@pytest.fixture(scope="module")
def reports(locks, tmp_path_factory):
    base, sdist_only, _ = locks
    work = tmp_path_factory.mktemp("gpu-lock")
    return L.resolve_all([L.GPU_TXT], {name: base[name] for name in sdist_only}, work)


def test_the_lock_is_what_pip_resolves_for_both_pythons(locks, reports):
    base, sdist_only, _ = locks
    assert sdist_only == {"connection-pool"}  # snakemake's, published only as an sdist
    assert set(reports) == {"3.11", "3.12"}
    for python, report in reports.items():
        got = L.resolved(report)
        assert {name: v for name, (v, _, _) in got.items()} == {name: v for name, (v, _) in base.items()}, python
        assert L.marker_drift(report, python) == []
        for name, (version, digest, url) in got.items():
            if name in sdist_only:
                # built here from the sdist the lock pins (pip wheel --require-hashes checked that hash)
                assert url.startswith("file:") and url.endswith(f"-{version}-py3-none-any.whl"), url
                continue
            assert url.startswith("https://files.pythonhosted.org/"), url
            assert digest in base[name][1], f"{name} {version} for Python {python}: {url}"
        assert {"torch", "triton", "kernels", "nvidia-nccl-cu13"} <= set(got)
    assert base["torch"][0] == "2.13.0" and base["triton"][0] == "3.7.1"
    # One lock for both: the CPython wheels of each version are in it.
    torch_wheels = {L.resolved(r)["torch"][2].rsplit("/", 1)[-1] for r in reports.values()}
    assert {w.split("-")[2] for w in torch_wheels} == {"cp311", "cp312"}


def test_every_lock_line_is_hash_pinned(locks):
    text = L.GPU_LOCK.read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    base, _, _ = locks
    assert len(lines) == len(base) > 100
    for line in lines:
        assert re.fullmatch(r"[A-Za-z0-9._-]+==\S+( +--hash=sha256:[0-9a-f]{64})+", line.strip()), line


def test_liger_kernel_is_an_option_on_top_of_the_lock(locks, tmp_path):
    """The optional lock adds liger-kernel only; what it needs (torch, triton) the base lock has."""
    from packaging.requirements import Requirement

    base, _, liger = locks
    assert set(liger) == {"liger-kernel"} and liger["liger-kernel"][0] == L.read_pins(L.LIGER_TXT)["liger-kernel"]
    (version,) = {liger["liger-kernel"][0]}
    work = tmp_path
    with L.metadata_index() as index:
        report_path = work / "r.json"
        args = ["install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet", "--target", str(work / "t")]
        args += ["--index-url", index, "--only-binary=:all:", "--python-version", "3.12"]
        args += [*(f"--platform={p}" for p in L.PLATFORMS), "--report", str(report_path)]
        out = L._pip(*args, f"liger-kernel=={version}", pip=L.resolver_pip(work))
    assert out.returncode == 0, out.stderr
    (item,) = json.loads(report_path.read_text())["install"]
    assert item["download_info"]["archive_info"]["hashes"]["sha256"] in liger["liger-kernel"][1]
    for spec in item["metadata"].get("requires_dist", []):
        requirement = Requirement(spec)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            name = L.canonical(requirement.name)
            assert name in base and base[name][0] in requirement.specifier, spec


def test_gpu_and_cpu_environments_agree_on_every_shared_package(locks):
    base, _, _ = locks
    cpu_top, cpu_lock = L.read_pins(L.CPU_TXT), L.read_pins(L.CPU_LOCK)
    gpu_top = L.read_pins(L.GPU_TXT)
    assert cpu_top["torch"] == gpu_top["torch"] == base["torch"][0] == "2.13.0"
    assert cpu_lock["torch"] == "2.13.0+cpu"  # the same release, its CPU build
    for name, version in gpu_top.items():
        assert base[name][0] == version, name
        if name in cpu_top:
            assert cpu_top[name] == version, name
    shared = (set(cpu_lock) & set(base)) - {"torch"}
    assert len(shared) > 80
    assert {name: base[name][0] for name in shared} == {name: cpu_lock[name] for name in shared}


def test_make_gpu_env_installs_by_hash():
    """`make gpu-env` as a dry run of itself (`make -n`): every package by its hash, then this one without
    dependencies; GPU_LIGER=1 adds the liger-kernel lock."""
    for extra, liger in (([], False), (["GPU_LIGER=1"], True)):
        argv = ["make", "-n", "gpu-env", *extra]
        out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        doc_commands.record(argv, out.returncode)
        assert out.returncode == 0, out.stdout + out.stderr
        installs = [line for line in out.stdout.replace("\\\n", " ").splitlines() if "pip install" in line]
        assert "--require-hashes -r envs/gpu.lock.txt" in installs[0]
        assert ("-r envs/gpu-liger.lock.txt" in installs[0]) == liger
        assert "--no-deps -e ." in installs[1]
