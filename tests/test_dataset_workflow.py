"""End-to-end through real snakemake: the dataset fetched from a loopback Hub (LFS redirects, byte ranges),
a download and an unpack each killed with SIGKILL mid-way, and both resumed by the next run."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from demo import VENV, copy_checkout, run

from videogrpo.config import read_task_list
from videogrpo.data.materialize import materialize
from videogrpo.demo import synthetic_dataset

from hub_server import HubServer

pytestmark = pytest.mark.e2e
COMMIT = "0123456789abcdef0123456789abcdef01234567"
BIG = 96 << 20  # incompressible bytes per padding member: an unpack or a download that takes a moment
DATA = {"source": "hub", "repo_id": "org/vbvr", "revision": COMMIT, "samples_per_task": 2, "heldout_per_task": 1}


def write_archive(path: Path, members: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with (
        gzip.GzipFile("", "wb", compresslevel=0, fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.fixture(scope="module")
def hub_archives(workdir) -> dict[str, bytes]:
    """Two archives as the Hub holds them; the second also carries two large members the unpack ignores."""
    tasks = read_task_list(workdir / "config/tasks/synthetic.txt")
    members = [{}, {}]
    for i, task in enumerate(tasks):
        for index in range(2):
            members[min(i, 1)].update(synthetic_dataset.sample_members(task, index, 0, 17, 64, 64, 16))
    some_sample = next(iter(members[1])).rsplit("/", 1)[0]
    rng = __import__("numpy").random.default_rng(0)
    for n in range(2):
        members[1][f"{some_sample}/video/raw_{n}.bin"] = rng.bytes(BIG)
    return {f"VBVR-Pro-RL-Video/part{i}.tar.gz": write_archive(Path(), m) for i, m in enumerate(members)}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    checkout = copy_checkout(tmp_path_factory.mktemp("dataset-checkout"))
    (checkout / "hub-data.yaml").write_text(yaml.safe_dump({"data": DATA}))
    return checkout


def start(workdir: Path, env: dict) -> subprocess.Popen:
    process = subprocess.Popen(
        ["snakemake", "validate_dataset", "--cores", "2", "--configfile", "hub-data.yaml"],
        cwd=workdir,
        env=dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    process.cwd = workdir
    return process


def kill_when(process: subprocess.Popen, condition, timeout: float = 120) -> None:
    """SIGKILL the whole run (snakemake, the job's shell, the stage and its workers) once condition() holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before it could be interrupted:\n{process.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError("the condition to interrupt never held")
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    # A killed snakemake leaves its lock; the user removes it (README) before the next run.
    run(["snakemake", "--unlock", "--configfile", "hub-data.yaml"], process.cwd)


def incomplete_bytes(workdir: Path) -> int:
    return sum(p.stat().st_size for p in workdir.glob("results/**/*.incomplete"))


def test_killed_download_and_killed_unpack_both_resume(workdir, hub_archives, tmp_path):
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(tmp_path / "hf-home")}
    with HubServer({("dataset", "org/vbvr"): {COMMIT: hub_archives}}, throttle=32 << 20) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        kill_when(start(workdir, env), lambda: incomplete_bytes(workdir) > 16 << 20)
        partial = incomplete_bytes(workdir)
        assert partial > 16 << 20 and not list(workdir.glob("results/**/VBVR-Pro-RL-Video/part1.tar.gz"))
        hub.handler.throttle = 0
        records = list(workdir.glob("results/**/.unpacked"))
        run_ = start(workdir, env)
        # The second run resumes the download, then is killed while it unpacks the large archive.
        kill_when(
            run_,
            lambda: (
                any(workdir.glob("results/**/.unpacked/part0.tar.gz.json"))
                and not any(workdir.glob("results/**/.unpacked/part1.tar.gz.json"))
            ),
        )
        assert not records
        resumed = [r for r in hub.requests if r.startswith("RANGE ")]
        assert resumed and int(resumed[0].split()[1]) >= 16 << 20, hub.requests  # not from byte 0
        fetched = [r for r in hub.requests if r.startswith("GET /lfs-cdn/")]
        third = run(["snakemake", "validate_dataset", "--cores", "2", "--configfile", "hub-data.yaml"], workdir, **env)
        assert [r for r in hub.requests if r.startswith("GET /lfs-cdn/")] == fetched, "nothing downloaded again"
    log = next(workdir.glob("results/**/materialize_dataset.log")).read_text()
    assert "1 archives unpacked, 1 kept" in log, log
    (materialization,) = workdir.glob("results/**/materialization.json")
    counts = json.loads(materialization.read_text())["counts"]
    assert counts["archives_kept"] == 1 and counts["archives_unpacked"] == 1
    raw = materialization.parent / "raw"
    assert not [p for p in raw.rglob("*") if p.name.endswith(".tmp")], "temporaries of the killed unpack remain"
    # The resumed tree is exactly a clean unpack of the same archives.
    clean_archives = tmp_path / "archives"
    clean_archives.mkdir()
    for name, data in hub_archives.items():
        (clean_archives / Path(name).name).write_bytes(data)
    tasks = read_task_list(workdir / "config/tasks/synthetic.txt")
    clean = materialize(
        sorted(clean_archives.glob("*.tar.gz")), tmp_path / "clean", tasks, 2, 1, 42, "s", {}, log=lambda _: None
    )
    manifest = json.loads(next(workdir.glob("results/**/materialize_dataset.manifest.json")).read_text())
    assert {k: tuple(v) for k, v in manifest["outputs"]["raw"]["entries"].items()} == clean.raw_entries
    assert (
        manifest["inputs"]["archives"]["tree_sha256"]
        == json.loads(next(workdir.glob("results/**/fetch_dataset.manifest.json")).read_text())["outputs"]["archives"][
            "tree_sha256"
        ]
    )
    assert "validated 6 samples" in next(workdir.glob("results/**/validate_dataset.log")).read_text()
    assert third.returncode == 0
