"""The default target requests every declared output of every stage job, output by output: Snakemake checks only
the outputs some job requests, so an output nothing downstream reads (train/final, the dataset's index files, the
report's RO-Crate) that a person or a failure removed would otherwise never be made again by a plain rerun. The DAG
is Snakemake's own, built in a fresh copy of the checkout for the default and every recipe."""

from __future__ import annotations

import json
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
    files = [Path(name)] if name != "default" else []
    with SnakemakeApi(OutputSettings()) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=files),
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
        }
print("PROBE " + json.dumps(found))
"""

CONFIGS = [
    "default",
    "config/recipes/rl_5b_cps.yaml",
    "config/recipes/rl_5b_vlm.yaml",
    "config/recipes/rl_a14b_rule.yaml",
]


@pytest.fixture(scope="module")
def dags(tmp_path_factory) -> dict[str, dict[str, list]]:
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *CONFIGS], cwd=checkout, capture_output=True, text=True, timeout=600
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
