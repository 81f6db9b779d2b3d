"""A job that failed before it started keeps the outputs it never touched, and a SLURM run starts only with a
controller that answers (pipeline/unstarted_jobs.py). The run through SLURM itself: tests/test_cluster.py."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from videogrpo.pipeline import unstarted_jobs


@pytest.fixture(autouse=True)
def fresh_records(monkeypatch):
    monkeypatch.setattr(unstarted_jobs, "_AT_START", {})
    monkeypatch.setattr(unstarted_jobs, "_SUBMITTED", set())


class Persistence:
    """Snakemake's incomplete marks, as its persistence keeps them per output."""

    def __init__(self):
        self.marked: set[str] = set()

    def _get_key(self, f):
        return str(f)

    def _unmark_incomplete(self, key):
        self.marked.discard(key)

    def _clear_cache(self):
        pass


def job(*outputs: Path, rule: str = "score_cell") -> SimpleNamespace:
    persistence = Persistence()
    return SimpleNamespace(
        output=[str(p) for p in outputs],
        rule=SimpleNamespace(name=rule),
        wildcards_dict={"model": "base", "sampler": "euler"},
        dag=SimpleNamespace(workflow=SimpleNamespace(persistence=persistence)),
        is_local=False,
    )


def outputs(tmp_path: Path) -> tuple[Path, Path]:
    scores, prepared = tmp_path / "scores.csv", tmp_path / "prepared"
    scores.write_text("name,score\na,1\n")
    prepared.mkdir()
    (prepared / "a.mp4").write_bytes(b"video")
    return scores, prepared


def test_a_job_never_submitted_or_untouched_since_the_start_is_unstarted(tmp_path):
    scores, prepared = outputs(tmp_path)
    paths = [os.path.abspath(p) for p in (scores, prepared)]
    assert not unstarted_jobs.unstarted(paths)  # not recorded at the start: Snakemake's way
    assert unstarted_jobs.record([job(scores, prepared)]) == 2
    assert unstarted_jobs.unstarted(paths)  # never submitted
    unstarted_jobs._SUBMITTED.update(paths)
    assert unstarted_jobs.unstarted(paths)  # submitted, but its process never touched them
    # Its process ran: Snakemake's prepare removed the outputs, the stage wrote one again.
    (prepared / "a.mp4").unlink()
    prepared.rmdir()
    scores.unlink()
    scores.write_text("name,score\na,1\n")
    assert not unstarted_jobs.unstarted(paths)


def test_a_job_with_nothing_from_before_is_left_to_snakemake(tmp_path):
    absent = tmp_path / "scores.csv"
    unstarted_jobs.record([job(absent)])
    assert not unstarted_jobs.unstarted([os.path.abspath(absent)])


def test_the_installed_postprocess_keeps_an_unstarted_jobs_outputs_and_marks(tmp_path, monkeypatch, capsys):
    """Snakemake's own Job.postprocess and Job.register, wrapped: a failed unstarted job is not post-processed (no
    cleanup, no new metadata) and the incomplete marks of its submission are taken back; any other call is
    Snakemake's."""
    from snakemake.jobs import Job

    calls = []

    async def postprocess(self, *args, **kwargs):
        calls.append(("postprocess", self.rule.name, kwargs.get("error", False)))

    def register(self, *args, **kwargs):
        self.dag.workflow.persistence.marked.update(self.output)

    monkeypatch.setattr(Job, "postprocess", postprocess)
    monkeypatch.setattr(Job, "register", register)
    unstarted_jobs.install()
    scores, prepared = outputs(tmp_path)
    failed = job(scores, prepared)
    unstarted_jobs.record([failed])
    Job.register(failed)  # the submission succeeded, then the scheduler gave up on the job before it ran
    assert failed.dag.workflow.persistence.marked
    asyncio.run(Job.postprocess(failed, error=True))
    assert calls == [] and scores.exists() and (prepared / "a.mp4").read_bytes() == b"video"
    assert not failed.dag.workflow.persistence.marked
    said = capsys.readouterr().err
    assert "score_cell ({'model': 'base', 'sampler': 'euler'}) failed before it started: its 2 output(s)" in said
    asyncio.run(Job.postprocess(failed))  # a success: Snakemake's
    scores.write_text("rewritten by the job")
    asyncio.run(Job.postprocess(failed, error=True))  # it ran: Snakemake's cleanup
    assert calls == [("postprocess", "score_cell", False), ("postprocess", "score_cell", True)]


def fake_sinfo(tmp_path: Path, status: int, said: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    sinfo = folder / "sinfo"
    sinfo.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {status}\n")
    sinfo.chmod(sinfo.stat().st_mode | stat.S_IEXEC)
    return folder


def test_a_slurm_controller_that_does_not_answer_is_said_in_one_line(tmp_path, monkeypatch):
    said = "sinfo: error: slurm_load_partitions: Unable to contact slurm controller (connect failure)"
    monkeypatch.setenv("PATH", f"{fake_sinfo(tmp_path, 1, said)}{os.pathsep}{os.environ['PATH']}")
    problem = unstarted_jobs.scheduler_problem("slurm", [job(tmp_path / "a")])
    assert problem == (
        f"the SLURM controller does not answer ({said}); nothing was submitted and every output is as it was: "
        f"rerun once `sinfo` answers"
    )
    assert "\n" not in problem
    assert unstarted_jobs.scheduler_problem("local", [job(tmp_path / "a")]) is None
    local = job(tmp_path / "a")
    local.is_local = True  # downloads and the report run on the login node: nothing to submit
    assert unstarted_jobs.scheduler_problem("slurm", [local]) is None


def test_a_slurm_controller_that_answers_lets_the_run_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_sinfo(tmp_path, 0, '')}{os.pathsep}{os.environ['PATH']}")
    assert unstarted_jobs.scheduler_problem("slurm", [job(tmp_path / "a")]) is None
