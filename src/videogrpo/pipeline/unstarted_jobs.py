"""The outputs of a job that failed before it started are kept, and a SLURM run starts only with a scheduler that
answers.

Snakemake removes the outputs of every failed job "since they might be corrupted" (`Job.postprocess(error=True)`,
then `Job.cleanup`). Under a cluster executor that includes a job whose submission failed (sbatch refused it, the
controller was down) and a job the scheduler gave up on before it ran: the outputs of an earlier run, complete and
recorded in their manifests, were lost to a job that never ran, and what depends on them (the report) silently
went stale. A job's own process removes its outputs before it runs (`Job.prepare`, on the node), so a job that got
as far as touching its outputs has changed them; one that did not has not.

So when a run starts (`record`, from the workflow's `onstart`: the DAG built, nothing removed yet), the stamp of each
existing output of every job about to run is recorded: device, inode, size, modification and change time (the
kernel sets the change time on every write, rename and `utime`, so no restore or rewrite keeps it). A failed job
counts as unstarted when it held outputs at the start and either was never submitted in this run, or every one of
its outputs still has its recorded stamp and none appeared. Its outputs are then left as they are, with Snakemake's
records of them as they were (no new metadata; the incomplete mark its submission wrote is taken back), and the log
says so. Any other failed job is cleaned up as Snakemake does. `install` puts this where Snakemake post-processes a
failed job; without the Snakemake internals it relies on, Snakemake's own behaviour stays.

`scheduler_problem` is the check, before any job is submitted, that the SLURM controller answers: otherwise the run
stops in one line, before anything is submitted or removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

from videogrpo.pipeline import snakemake_patch

# Output path -> its stamp when the run started (None: absent then), for every job about to run.
_AT_START: dict[str, tuple[int, ...] | None] = {}
# Output paths of the jobs this run handed to an executor (Snakemake registers a job when its submission succeeded).
_SUBMITTED: set[str] = set()
SCHEDULER_TIMEOUT_S = 60


def stamp(path: str) -> tuple[int, ...] | None:
    """What tells this file (or directory) from any later one at the same path; None when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _paths(job: Any) -> list[str]:
    return [os.path.abspath(str(f)) for f in job.output]


def record(jobs: Iterable[Any]) -> int:
    """Record the outputs of the jobs about to run (anything with `output`); returns how many exist."""
    found = 0
    for job in jobs:
        for path in _paths(job):
            _AT_START[path] = stamp(path)
            found += _AT_START[path] is not None
    return found


def unstarted(paths: list[str]) -> bool:
    """Whether a failed job with these outputs never touched them (see the module docstring)."""
    if not paths or any(path not in _AT_START for path in paths):
        return False  # not recorded when the run started: nothing is known, Snakemake's way
    if not any(_AT_START[path] is not None for path in paths):
        return False  # nothing from before to keep
    if not any(path in _SUBMITTED for path in paths):
        return True
    return all(stamp(path) == _AT_START[path] for path in paths)


def _take_back_marks(job: Any) -> None:
    """Remove the incomplete marks a submission wrote (Snakemake's records otherwise stay as they were)."""
    persistence = job.dag.workflow.persistence
    unmark, key = getattr(persistence, "_unmark_incomplete", None), getattr(persistence, "_get_key", None)
    if unmark is None or key is None:  # the marks stay: the next run reruns the job, which costs nothing kept
        return
    persistence._clear_cache()
    for f in job.output:
        unmark(key(f))


def install() -> None:
    """Wrap Snakemake's Job.register (a submission that succeeded) and Job.postprocess (a failed job's cleanup)."""
    if (found := snakemake_patch.originals("snakemake.jobs", "Job", "postprocess", "register")) is None:
        return
    job, postprocess, register = found

    def registered(self, *args, **kwargs):
        _SUBMITTED.update(_paths(self))
        return register(self, *args, **kwargs)

    async def kept_or_postprocessed(self, *args, **kwargs):
        paths = _paths(self)
        if kwargs.get("error") and unstarted(paths):
            if any(path in _SUBMITTED for path in paths):
                _take_back_marks(self)
            kept = [path for path in paths if _AT_START.get(path) is not None]
            print(
                f"{self.rule.name} ({self.wildcards_dict or 'no wildcards'}) failed before it started: its "
                f"{len(kept)} output(s) from before are kept as they were",
                file=sys.stderr,
            )
            return None
        return await postprocess(self, *args, **kwargs)

    snakemake_patch.replace(job, register=registered, postprocess=kept_or_postprocessed)


def scheduler_problem(executor: str, jobs: Iterable[Any]) -> str | None:
    """Why the SLURM controller cannot take this run's jobs (it does not answer), in one line; None when it
    answers, when no job goes to it (every job about to run is local), or under another executor."""
    if executor != "slurm" or all(getattr(job, "is_local", False) for job in jobs):
        return None
    if shutil.which("sinfo") is None:
        return "profiles/slurm: SLURM's sinfo is not on PATH here: run from a login node of the cluster"
    try:
        out = subprocess.run(
            ["sinfo", "--noheader", "--format=%P"],
            capture_output=True,
            text=True,
            timeout=SCHEDULER_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        why = f"sinfo gave no answer in {SCHEDULER_TIMEOUT_S} s"
    else:
        if out.returncode == 0:
            return None
        why = " ".join((out.stderr or out.stdout).split()) or f"sinfo exited with status {out.returncode}"
    return (
        f"the SLURM controller does not answer ({why}); nothing was submitted and every output is as it was: "
        f"rerun once `sinfo` answers"
    )
