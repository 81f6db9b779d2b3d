"""Whether this process runs inside the SLURM job its environment names.

SLURM_JOB_ID in the environment is a claim, not a fact: a login shell inside an old allocation, a copied
environment, or `SLURM_JOB_ID=12345 snakemake ...` typed by hand all carry one. A manifest records a SLURM job, and
the cost of a stage is counted from a SLURM allocation, only when SLURM confirms the job:
- by the process tree: every process of a job descends from one of the job's slurmstepd processes, whose title
  names the job (`slurmstepd: [12345.batch]`, `[12345.0]`, `[12345.extern]`): such an ancestor confirms it;
- else (a container that hides the host's processes) by the controller: squeue lists the job as running on the
  node that SLURMD_NODENAME names.
Otherwise the manifest keeps what the environment claimed and says that SLURM did not confirm it, and why; its
cost is counted as outside SLURM.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SQUEUE_TIMEOUT_S = 20


@dataclass(frozen=True)
class SlurmJob:
    """What the environment claimed (SLURM_JOB_ID), whether SLURM confirmed it, and how (or why not)."""

    claimed: str
    confirmed: bool
    how: str

    def record(self) -> dict[str, Any]:
        return asdict(self)


def _parent_and_title(pid: int) -> tuple[int, str] | None:
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):
        return None
    return parent, title


def stepd_ancestor(job_id: str, pid: int | None = None) -> int | None:
    """The pid of an ancestor of `pid` (this process) that is a slurmstepd of job `job_id`; None when none is."""
    pattern = re.compile(rf"^slurmstepd: \[{re.escape(job_id)}[.\]]")
    pid, seen = pid or os.getpid(), set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        found = _parent_and_title(pid)
        if found is None:
            return None
        parent, title = found
        if pattern.match(title):
            return pid
        pid = parent
    return None


def _squeue(job_id: str, node: str | None) -> tuple[bool, str]:
    """(confirmed, how) from the controller: the job runs on `node`."""
    if not node:
        return False, "no slurmstepd of the job among this process's ancestors, and SLURMD_NODENAME is unset"
    squeue = shutil.which("squeue")
    if squeue is None:
        return False, "no slurmstepd of the job among this process's ancestors, and no squeue here to ask"
    argv = [squeue, "--noheader", "--jobs", job_id, "--format=%T %N"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"squeue did not answer ({type(err).__name__})"
    if out.returncode != 0 or not out.stdout.strip():
        said = " ".join((out.stderr or "").split())[:200] or "no such job"
        return False, f"squeue does not list job {job_id} ({said})"
    state, _, nodes = out.stdout.split("\n")[0].strip().partition(" ")
    if state not in ("RUNNING", "COMPLETING"):
        return False, f"squeue lists job {job_id} as {state}, not running"
    expanded = (
        subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=False
        ).stdout.split()
        if shutil.which("scontrol")
        else nodes.split(",")
    )
    if node not in expanded:
        return False, f"job {job_id} runs on {nodes}, not on {node} (SLURMD_NODENAME)"
    return True, f"squeue: job {job_id} runs on {node}"


@functools.lru_cache(maxsize=8)
def _judge(job_id: str, node: str | None) -> SlurmJob:
    if (stepd := stepd_ancestor(job_id)) is not None:
        return SlurmJob(job_id, True, f"process {stepd} of this process's ancestors is the job's slurmstepd")
    confirmed, how = _squeue(job_id, node)
    return SlurmJob(job_id, confirmed, how)


def slurm_job(env: dict[str, str] | None = None) -> SlurmJob | None:
    """The SLURM job the environment claims, judged (see the module docstring); None when it claims none."""
    env = os.environ if env is None else env
    claimed = (env.get("SLURM_JOB_ID") or "").strip()
    if not claimed:
        return None
    return _judge(claimed, env.get("SLURMD_NODENAME"))


def confirmed_job_id(env: dict[str, str] | None = None) -> str | None:
    """The SLURM job this process runs in, when SLURM confirms it; else None."""
    job = slurm_job(env)
    return job.claimed if job is not None and job.confirmed else None
