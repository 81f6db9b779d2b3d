"""What Snakemake's own DAG says, built in a fresh copy of the checkout for the default and three recipes:
- the default target requests every declared output of every stage job, output by output: Snakemake checks only the
  outputs some job requests, so an output nothing downstream reads (train/final, the dataset's index files, the
  report's RO-Crate) that a person or a failure removed would otherwise never be made again by a plain rerun;
- the EvalKit checkout somewhere else (evalkit.path, pinned by evalkit.digest) changes no job's inputs, params or
  outputs: what Snakemake compares to decide a rerun, so a moved copy reruns nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from demo import copy_checkout

# Runs in the copy: builds each config's DAG with Snakemake's API (no job runs, nothing is written under results/)
# and prints, per config, every (rule, output) of a stage job and the outputs the target `all` requests.
PROBE = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

found = {}
for name in sys.argv[1:]:
    given = json.loads(name)
    with SnakemakeApi(OutputSettings()) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(
                configfiles=[Path(f) for f in given["files"]], config=given.get("config", {})
            ),
            snakefile=Path("Snakefile"),
            workdir=Path("."),
        )
        workflow = workflow_api.dag(DAGSettings()).workflow_api._workflow
        workflow._prepare_dag(forceall=False, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        workflow._build_dag()
        jobs = list(workflow.dag.jobs)
        (target,) = [job for job in jobs if job.rule.name == "all"]
        found[name] = {
            "outputs": sorted([job.rule.name, str(out)] for job in jobs for out in job.output),
            "requested": sorted(str(path) for path in target.input),
            "jobs": sorted(
                json.dumps([job.rule.name, sorted(map(str, job.input)), {k: str(v) for k, v in job.params.items()}])
                for job in jobs
                if job.rule.name != "all"
            ),
        }
print("PROBE " + json.dumps(found))
"""


def given(*files: str, **config) -> str:
    return json.dumps({"files": list(files), "config": config})


CONFIGS = [
    given(),
    given("config/recipes/rl_5b_cps.yaml"),
    given("config/recipes/rl_5b_vlm.yaml"),
    given("config/recipes/rl_a14b_rule.yaml"),
]
KIT = "src/videogrpo/demo/stand_in_evalkit"
MOVED_KIT = given(evalkit={"path": "elsewhere/kit"})


@pytest.fixture(scope="module")
def dags(tmp_path_factory) -> dict[str, dict[str, list]]:
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    shutil.copytree(checkout / KIT, checkout / "elsewhere/kit")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *CONFIGS, MOVED_KIT], cwd=checkout, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert not (checkout / "results").exists(), "building the DAG wrote under results/"
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE "))


@pytest.mark.parametrize("config", CONFIGS)
def test_the_default_target_requests_every_output_of_every_stage_job(dags, config):
    found = dags[config]
    requested = set(found["requested"])
    missed = [f"{rule}: {path}" for rule, path in found["outputs"] if path not in requested]
    assert not missed, f"outputs a plain rerun would not make again when removed ({config}):\n" + "\n".join(missed)
    rules = {rule for rule, _ in found["outputs"]}
    # Every kind of stage is in the DAG (so the check covers them): those nothing downstream reads included.
    assert {"train", "materialize_dataset", "report", "generate_cell", "score_cell"} <= rules, rules
    assert any(path.endswith("/train/final") for _, path in found["outputs"])
    assert any(path.endswith("/materialized/materialization.json") for _, path in found["outputs"])


def test_the_evalkit_elsewhere_with_its_digest_changes_no_job(dags):
    """evalkit.path is an execution field: the default DAG and the one with the checkout copied elsewhere hold the
    same jobs with the same inputs, params and outputs (the params name the stage config file by its params'
    digest), so Snakemake plans nothing for the move."""
    default, moved = dags[CONFIGS[0]], dags[MOVED_KIT]
    assert default["outputs"] == moved["outputs"] and default["jobs"] == moved["jobs"]
    assert not any("elsewhere" in job or KIT in job for job in moved["jobs"])
