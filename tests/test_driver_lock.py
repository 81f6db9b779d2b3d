"""A lock a killed Snakemake driver left (pipeline/driver_lock.py): taken over only when provably stale, otherwise
explained with who may hold it and when `snakemake --unlock` is safe."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from videogrpo.pipeline import driver_lock

BIN = Path(sys.executable).parent


def locked_by(lockdir: Path, pid: int, pgid: int, **record) -> Path:
    """Lock files and the record of the driver `pid` (process group `pgid`) that holds them."""
    lockdir.mkdir(parents=True, exist_ok=True)
    (lockdir / "0.input.lock").write_text("results/a\n")
    (lockdir / "0.output.lock").write_text("results/b\n")
    path = driver_lock.record_driver(lockdir, "local")
    data = driver_lock.json.loads(path.read_text())
    data.update({"pid": pid, "pgid": pgid, "start_ticks": driver_lock._start_ticks(pid), **record})
    path.unlink()
    target = lockdir / f"{driver_lock.RECORD_PREFIX}{data['host']}-{pid}.json"
    target.write_text(driver_lock.json.dumps(data))
    return target


@pytest.fixture
def sleeper():
    """A process leading its own process group, as a driver started from a shell is."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_a_driver_that_still_runs_keeps_its_lock_and_is_named(tmp_path, sleeper):
    lockdir = tmp_path / "locks"
    locked_by(lockdir, sleeper.pid, sleeper.pid)
    message = driver_lock.take_over_or_explain(lockdir)
    assert message.startswith(f"{os.getcwd()}: the files of this run are locked by another Snakemake ({lockdir}):")
    assert f"the Snakemake driver pid {sleeper.pid} on {socket.gethostname()}" in message and "it still runs" in message
    assert message.splitlines()[-1] == driver_lock.UNLOCK_WHEN and (lockdir / "0.input.lock").exists()


def test_the_lock_of_a_killed_local_driver_is_taken_over_once_its_jobs_are_gone(tmp_path, sleeper, capsys):
    """kill -9 of the driver: its job (here the sleeper, in its process group) still runs, so the lock stays and
    the message names the job; once it is gone, the rerun removes the lock and says whose it was."""
    lockdir = tmp_path / "locks"
    # The driver gone: this pid, but another start time (the pid reused by another process).
    record = locked_by(lockdir, os.getpid(), sleeper.pid, start_ticks="0")
    message = driver_lock.take_over_or_explain(lockdir)
    assert "it is gone, but 1 process(es) it started still run" in message
    assert f"pid {sleeper.pid}: sleep 60" in message and f"`kill {sleeper.pid}`" in message
    sleeper.kill()
    sleeper.wait()
    assert driver_lock.take_over_or_explain(lockdir) is None
    assert sorted(p.name for p in lockdir.iterdir()) == []
    said = capsys.readouterr().err
    assert said.startswith(f"removed the lock the Snakemake driver pid {os.getpid()} on {socket.gethostname()}")
    assert "killed before it could unlock" in said and not record.exists()


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"host": "login-2"}, "it ran on login-2, so this machine cannot see whether it still runs"),
        ({"executor": "slurm"}, "its jobs ran under the slurm executor and may still run"),
    ],
)
def test_a_lock_whose_holder_cannot_be_seen_gone_is_explained_not_taken(tmp_path, record, why):
    lockdir = tmp_path / "locks"
    locked_by(lockdir, os.getpid(), os.getpgrp(), start_ticks="0", **record)
    assert why in driver_lock.take_over_or_explain(lockdir) and (lockdir / "0.output.lock").exists()


def test_a_lock_no_record_explains_is_left_to_the_user(tmp_path):
    lockdir = tmp_path / "locks"
    lockdir.mkdir()
    (lockdir / "0.input.lock").write_text("results/a\n")
    assert "0.input.lock: no record says which Snakemake took it" in driver_lock.take_over_or_explain(lockdir)
    assert (lockdir / "0.input.lock").exists()


SNAKEFILE = """
from videogrpo.pipeline import driver_lock

driver_lock.install()


onstart:
    driver_lock.record_workflow_driver(workflow)


rule slow:
    output:
        "out.txt",
    shell:
        "sleep 30 && touch {output}"
"""


def test_a_rerun_after_kill_9_of_the_driver_and_its_job_takes_the_stale_lock_over(tmp_path):
    """The real Snakemake: its lock files and where it takes them are what the take-over relies on."""
    (tmp_path / "Snakefile").write_text(textwrap.dedent(SNAKEFILE))
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    argv = [str(BIN / "snakemake"), "--cores", "1"]
    driver = subprocess.Popen(argv, cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any("sleep 30" in args for _, args in driver_lock._group_members(driver.pid)):  # the job runs
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    assert list((tmp_path / ".snakemake/locks").glob(f"{driver_lock.RECORD_PREFIX}*.json"))
    driver.kill()  # kill -9 of the driver alone: its job (sleep 30) runs on, in its process group
    driver.wait()
    refused = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "process(es) it started still run" in refused.stderr, refused.stderr
    # Snakemake's own exception, shown as it shows its own: the account last, no traceback of the workflow's code.
    assert refused.stderr.rstrip().splitlines()[-1] == driver_lock.UNLOCK_WHEN, refused.stderr[-2000:]
    assert "LockException:\n" in refused.stderr and "driver_lock.py" not in refused.stderr
    os.killpg(driver.pid, signal.SIGKILL)  # what the message says to do
    time.sleep(0.5)
    # A dry run takes no lock and removes nothing: it says that the lock is stale and that a run takes it over.
    dry = subprocess.run([*argv, "-n"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert dry.returncode == 0 and "Directory cannot be locked" not in dry.stdout + dry.stderr, dry.stderr
    assert f"holds the lock of the Snakemake driver pid {driver.pid}" in dry.stderr, dry.stderr
    assert "the next run takes the lock over (this dry run changes nothing)" in dry.stderr
    assert list((tmp_path / ".snakemake/locks").glob("*.lock"))
    touched = subprocess.run([*argv, "--touch"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert touched.returncode == 0, touched.stderr
    assert f"removed the lock the Snakemake driver pid {driver.pid}" in touched.stderr
