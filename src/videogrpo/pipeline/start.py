"""What the workflow does once when a run starts (its `onstart`), and never while it is read or on a dry run.

Snakemake runs `onstart` in the main process of a real invocation, after the DAG is built and before any job
starts or any output is removed; never on a dry run, never in a job's own process (a SLURM job step re-reads the
workflow). So everything the workflow writes for a run is written here, in this order:
- first the one check of the inputs of the stages about to run (pipeline/start_check.py), which stops the run
  before a refused input costs any output, and before anything below is written: a run that never starts leaves
  no record that a later command could mistake for its own;
- the invocation record the report shows (the config files with their digests, the `--config` overrides), also
  kept per run, for `verify` and `diff` to name the command that rebuilds that run;
- the list of manifests the run expects, which `videogrpo verify` reads to name a missing one;
- each stage's config file (pipeline/stage_config.py), with a note on execution fields changed since.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from videogrpo import atomic
from videogrpo.config import Config
from videogrpo.errors import VideoGRPOError
from videogrpo.pipeline import stage_config
from videogrpo.pipeline.start_check import MANIFEST_SUFFIX, StageJob, check_jobs, raise_on
from videogrpo.provenance import digest_cache
from videogrpo.provenance.digest import sha256_file
from videogrpo.provenance.rebuild import run_invocation_path, stage_list

INVOCATION = "invocation.json"


def invocation_path(results: str | Path) -> Path:
    """The invocation record of the latest run (constant name: a new invocation alone reruns nothing)."""
    return Path(results) / stage_config.CONFIG_DIR / INVOCATION


def invocation(configfiles: Iterable[str | Path], overrides: dict[str, Any]) -> dict[str, Any]:
    return {
        "configfiles": [{"path": str(path), "sha256": sha256_file(path)} for path in configfiles],
        "config_overrides": dict(overrides),
    }


def stage_jobs(
    jobs: Iterable[Any],
    stages: Iterable[str],
    undeclared_reads: dict[str, dict[str, str]],
    undeclared_writes: dict[str, list[str]],
    evalkit_readers: set[str],
    evalkit: tuple[str, str],
    pinned_inputs: set[str],
    tree: tuple[str, str] | None,
) -> list[StageJob]:
    """StageJobs of Snakemake's jobs (anything with `rule.name`, named `input` and `output`): the stage jobs only,
    their named inputs but the pinned ones (checked by their pin), their upstream manifests, what they read beyond
    their declared inputs (`undeclared_reads`, by stage: paths by name, the manifests that vouch for them
    included), what they write beyond their declared outputs (`undeclared_writes`, by stage: a job that writes it
    remakes it, so no other job of the run checks it against its old record), and their pins."""
    stages = set(stages)
    found = []
    for job in jobs:
        stage = job.rule.name
        if stage not in stages:
            continue
        inputs, upstream = {}, []
        for name, value in [*job.input.items(), *undeclared_reads.get(stage, {}).items()]:
            if name in pinned_inputs or name in inputs:
                continue
            for path in [value] if isinstance(value, str) else list(value):
                if str(path).endswith(MANIFEST_SUFFIX):
                    upstream += [] if str(path) in upstream else [str(path)]
                else:
                    inputs[name] = str(path)
        found.append(
            StageJob(
                stage,
                inputs,
                upstream,
                [str(out) for out in job.output] + list(undeclared_writes.get(stage, [])),
                evalkit if stage in evalkit_readers else None,
                tree if stage == "eval_set" else None,
            )
        )
    return found


def begin_run(
    cfg: Config,
    results: str | Path,
    run_id: str,
    manifests: dict[str, str],
    configfiles: Iterable[str | Path],
    overrides: dict[str, Any],
    jobs: list[StageJob],
    object_storage: bool,
) -> None:
    """Everything a real run writes before its first job (see the module docstring); raises VideoGRPOError, which
    the workflow turns into its refusal, when an input at risk is not what its stage made. A refused run writes
    nothing: its invocation, stage list and config values are never mistaken for those of a run that ran."""
    results = Path(results)
    checked, elapsed = 0, 0.0
    if not object_storage:  # the jobs' inputs are objects in the bucket, copied to each job: the stages check them
        t0 = time.monotonic()
        checked, problems = check_jobs(jobs, digest_cache.cache_path(results))
        raise_on(problems)
        elapsed = time.monotonic() - t0
    record = invocation(configfiles, overrides)
    try:
        atomic.write_json(invocation_path(results), record)
    except OSError as err:
        raise VideoGRPOError(
            f"results = {str(results)!r}: cannot write {invocation_path(results)} ({type(err).__name__}: {err}); "
            f"point `results` at a writable directory, e.g. --config results=/scratch/$USER/videogrpo-results"
        ) from None
    atomic.write_json(run_invocation_path(results, run_id), record)
    atomic.write_json(stage_list(results, run_id), manifests)
    stages = sorted({job.stage for job in jobs} | {key.split(":")[0] for key in manifests})
    for note in stage_config.write_config_files(results, cfg, stages):
        print(note, file=sys.stderr)
    if checked:
        print(
            f"checked the inputs of {checked} stage job(s) that hold outputs from before, in {elapsed:.1f} s: each is "
            f"what its stage made",
            file=sys.stderr,
        )
