"""One check of the stages' inputs when a run starts, before Snakemake removes any output.

Snakemake deletes a job's outputs before it runs the job, so a stage that refused its inputs itself would already
have cost its earlier, good outputs (a hand-edited table the whole report, a corrupted weight file the evaluation).
So when a run starts (the workflow's `onstart`: after the DAG is built, before any output is removed, never on a
dry run), every stage job that is about to run and still has outputs from before is checked: each of its inputs
that no job of this run remakes must be byte for byte what its upstream manifest recorded (a manifest cut short
is refused too), and an external evaluation tree must be at its pinned digest. The EvalKit checkout is checked
once for every job about to run that reads it, with outputs or not (`evalkit_problem`, which the workflow also
runs when it is read, to warn in a dry run). Anything wrong stops the run there, each problem said once with the
jobs it stops, naming the file, both digests and the fix, and every output stays as it was. A job with no outputs
yet has nothing to lose: it checks its inputs itself when it reads them (provenance/manifest.py's StageRun), as
every stage does.

"Everything the stage reads" includes what it reads beyond its declared inputs (the dataset's raw/ and
splits.json on a shared file system): the workflow names those per stage.

A file of a directory input whose stamp matches a digest recorded earlier is trusted (provenance/digest_cache.py):
a model pipeline of tens of GB is hashed once for all the runs, cells and reports that read it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from videogrpo.errors import DigestMismatch, VideoGRPOError
from videogrpo.provenance import digest, digest_cache
from videogrpo.provenance.manifest import describe_cached, verify_inputs

MANIFEST_SUFFIX = ".manifest.json"


@dataclass
class StageJob:
    """What one stage job reads: inputs by name, the manifests of the stages that made them, and its pins."""

    stage: str
    inputs: dict[str, str] = field(default_factory=dict)
    upstream: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    evalkit: tuple[str, str] | None = None  # (checkout, pinned digest)
    tree: tuple[str, str] | None = None  # (external evaluation tree, pinned digest)


def _abs(path: str) -> str:
    return os.path.abspath(path)


def _inside(path: str, roots: set[str]) -> bool:
    return path in roots or any(parent in roots for parent in map(str, Path(path).parents))


def jobs_at_risk(jobs: Iterable[StageJob]) -> list[StageJob]:
    """The jobs that hold outputs from before (Snakemake removes them when the job starts), each reduced to the
    inputs and upstream manifests that no job of this run remakes."""
    jobs = list(jobs)
    remade = {_abs(out) for job in jobs for out in job.outputs}
    found = []
    for job in jobs:
        if not any(os.path.exists(out) for out in job.outputs):
            continue
        inputs = {name: path for name, path in job.inputs.items() if not _inside(_abs(path), remade)}
        upstream = [path for path in job.upstream if _abs(path) not in remade]
        found.append(StageJob(job.stage, inputs, upstream, job.outputs, job.evalkit, job.tree))
    return found


def evalkit_problem(path: str, pinned: str) -> str | None:
    """Why the EvalKit checkout at evalkit.path cannot be read as the pinned one (missing, or off evalkit.digest);
    None when it can."""
    from videogrpo.rewards.evalkit import check_checkout, check_digest

    try:
        check_digest(check_checkout(path), pinned)
    except VideoGRPOError as err:
        return str(err)
    return None


def check_job(job: StageJob, cache: dict[str, list], seen: dict[str, list]) -> list[str]:
    """What is wrong with one job's inputs (empty: nothing); its EvalKit is checked_jobs' to check, once."""
    problems = []
    try:
        records = {
            name: describe_cached(path, cache, seen) for name, path in job.inputs.items() if os.path.exists(path)
        }
        missing = sorted(name for name, path in job.inputs.items() if not os.path.exists(path))
        if missing and job.upstream:
            problems += [f"{job.inputs[name]}: input {name} of {job.stage} is missing" for name in missing]
        verify_inputs(records, [Path(p) for p in job.upstream])
    except VideoGRPOError as err:
        problems.append(str(err))
    if job.tree:
        path, pinned = job.tree
        if not Path(path).is_dir():  # not there at all: no digest to compare, and nothing "changed" in it
            problems.append(
                f"matrix.eval_set = {path!r}: no such directory (the evaluation tree matrix.eval_set_digest pins as "
                f"{pinned}); point matrix.eval_set at it, or restore it there"
            )
        elif (found := digest.tree_digest(Path(path))) != pinned:
            problems.append(
                f"{path}: tree SHA-256 {found}, but matrix.eval_set_digest pins {pinned}: the evaluation set "
                f"changed; restore it, or pin the new digest knowingly"
            )
    return problems


def _jobs_named(stages: list[str]) -> str:
    """`score_cell (6 jobs), train`: the jobs one problem stops, each stage once, by name."""
    counts = Counter(stages)
    return ", ".join(f"{stage} ({n} jobs)" if n > 1 else stage for stage, n in sorted(counts.items()))


def check_jobs(jobs: Iterable[StageJob], cache_path: Path | None) -> tuple[int, list[str]]:
    """Check every job at risk and, once, the EvalKit of every job that reads it (see the module docstring);
    returns (jobs at risk checked, problems, each once, prefixed with the jobs it stops). The digests that passed
    go into the cache."""
    jobs = list(jobs)
    cache, seen = digest_cache.load(cache_path), {}
    stopped: dict[str, list[str]] = {}  # problem -> the stages of the jobs it stops, in order
    readers: dict[tuple[str, str], list[str]] = {}
    for job in jobs:
        if job.evalkit:
            readers.setdefault(job.evalkit, []).append(job.stage)
    for (path, pinned), stages in readers.items():
        if problem := evalkit_problem(path, pinned):
            stopped.setdefault(problem, []).extend(stages)
    at_risk = jobs_at_risk(jobs)
    for job in at_risk:
        for problem in check_job(job, cache, seen):
            stopped.setdefault(problem, []).append(job.stage)
    problems = [f"{_jobs_named(stages)}: {problem}" for problem, stages in stopped.items()]
    if not problems:  # only digests that passed; never a wrong one
        digest_cache.save(cache_path, seen)
    return len(at_risk), problems


def refusal(problems: list[str]) -> str:
    listed = "\n".join("  - " + problem.replace("\n", "\n    ") for problem in problems)
    what = (
        "an input is not what its stage made or its pin says"
        if len(problems) == 1
        else (f"{len(problems)} inputs are not what their stages made or their pins say")
    )
    return f"the run stopped before it started, and every output is as it was: {what}:\n{listed}"


def raise_on(problems: list[str]) -> None:
    if problems:
        raise DigestMismatch(refusal(problems))
