"""Cluster tier: a real two-node SLURM cluster on this machine, driven by `snakemake --profile profiles/slurm`.

Needs root and Debian's SLURM packages (installed when missing). Locally the tier is skipped, with the
reason, when that is impossible; under CI (CI=true) that is a failure, since CI must run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from cluster.localslurm import SYSTEM_CONF, ClusterUnavailable, LocalSlurm, _alive, free_port
from demo import CELLS, SAMPLERS, copy_checkout, first_run_id, jobs_run, run

pytestmark = pytest.mark.cluster
TEST_PROFILE = ["--profile", "profiles/slurm", "--workflow-profile", "tests/cluster/profile"]


def start_or_skip(root: Path) -> LocalSlurm:
    cluster = LocalSlurm(root)
    try:
        cluster.start()
    except ClusterUnavailable as why:
        cluster.stop()
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the cluster tier, but: {why}")
        pytest.skip(f"cluster tier not run here: {why}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def test_harness_starts_two_idle_nodes_and_stops_everything(tmp_path):
    cluster = start_or_skip(tmp_path / "slurm")
    pids = list(cluster.pids)
    try:
        out = subprocess.run(
            ["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", "echo $SLURMD_NODENAME"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sorted(out.stdout.split()) == ["node1", "node2"], out.stderr
    finally:
        cluster.stop()
    assert not any(_alive(pid) for pid in pids)
    assert not (tmp_path / "slurm").exists() and not SYSTEM_CONF.exists()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = start_or_skip(tmp_path_factory.mktemp("cluster") / "slurm")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    return copy_checkout(tmp_path_factory.mktemp("cluster-checkout"))


def final_state(run_dir: Path) -> tuple[bytes, list[dict], str]:
    weights = (run_dir / "train/final/transformer/diffusion_pytorch_model.safetensors").read_bytes()
    metrics = [json.loads(line) for line in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    for m in metrics:  # wall-clock timings legitimately differ
        for key in [k for k in m if k.startswith("time_")]:
            del m[key]
    return (
        weights,
        metrics,
        (run_dir / "matrix/per_task.csv").read_text(),
        (run_dir / "matrix/matrix.csv").read_text(),
    )


def test_two_node_training_killed_once_resumes_and_equals_the_local_run(slurm, checkout, demo, workdir):
    """The local run to compare with is the shared demo (`snakemake --cores 2` on the same checkout); here the
    shared stages run locally first (--omit-from preflight), so that the cluster run must reuse them. Its training
    job is killed once it has a checkpoint (scancel stands in for a job SLURM kills at its time limit): Snakemake
    resubmits it (train.retries: 1), it resumes from the checkpoint
    and finishes, bit-identical to the uninterrupted local run. (That a plain rerun after a failed run resumes is
    Snakemake's and the trainer's, without SLURM: test_workflow_reruns.)"""
    local_run = workdir / "results/runs" / first_run_id(workdir)
    run(["snakemake", "--cores", "2", "--omit-from", "preflight"], checkout)
    assert not list(checkout.glob("results/runs/*/preflight.manifest.json"))
    # The driver as one started inside an sbatch or salloc allocation: SLURM_JOB_ID in its environment. It is
    # still the driver (Snakemake's onstart, not the environment, says so): it records its invocation.
    (checkout / "results/.stage-config/invocation.json").unlink()
    env = dict(
        os.environ, PATH=f"{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="4242"
    )
    driver_log = checkout / "driver.log"  # a file, not a pipe: nobody reads a pipe while we poll
    argv = ["snakemake", *TEST_PROFILE, "--config", "train={retries: 1}"]
    with open(driver_log, "w") as sink:
        driver = subprocess.Popen(argv, cwd=checkout, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        kill_when_checkpointed(checkout, driver, driver_log)
        driver.wait(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    output = driver_log.read_text()
    # The killed attempt, as the driver saw it (a failed job's log, which it prints, says "Error in rule" too).
    killed = re.findall(r"SLURM-job '(\d+)' failed, SLURM status is: 'CANCELLED'", output)
    assert len(set(killed)) == 1 and "Trying to restart job" in output, output[-4000:]
    assert driver.returncode == 0, output[-4000:]  # resubmitted, resumed, finished
    jobs = jobs_run(output)
    assert {"preflight", "train", "matrix", "report"} <= set(jobs)  # shared stages were reused
    # The base model's matrix cells are shared by the runs; the trained model's are this run's.
    assert jobs["generate_cell"] == jobs["score_cell"] == len(SAMPLERS) and "eval_set" not in jobs
    (cluster_run,) = [p.parent for p in checkout.glob("results/runs/*/preflight.manifest.json")]
    log = (cluster_run / "logs/train.log").read_text()  # the resubmitted job's
    total = json.loads((cluster_run / "train.manifest.json").read_text())["params"]["train"]["max_steps"]
    resumed = re.search(rf"resumed from \S+/step-\d{{8}} \(update (\d+) of {total}\)", log)
    assert resumed and int(resumed.group(1)) >= 2, log
    assert re.search(r"\[rank \d/2\] host \S+ slurm node node1", log), log
    assert re.search(r"\[rank \d/2\] host \S+ slurm node node2", log), log
    assert "[launch] node 0/2" in log and "[launch] node 1/2" in log and "(slurm)" in log
    assert list((checkout / "results/slurm-logs/rule_train").glob("*.log"))
    # Same seeds, same world size (1 node x 2 processes vs 2 nodes x 1 process), same CPU thread count:
    # every random draw is keyed by counters, and a two-rank all-reduce is a + b on either topology,
    # so the trained weights, the metrics (each update once) and the evaluation must be bit-identical.
    assert final_state(cluster_run) == final_state(local_run)
    # What the jobs cost: training's manifest counts its 2 nodes (no GPU on CPU), the trace names each job's id
    # (sacct has no accounting storage here: the manifests' COMPLETED stands), a stage run outside SLURM none.
    train = json.loads((cluster_run / "train.manifest.json").read_text())
    assert train["slurm_job_id"] and (train["cost"]["nodes"], train["cost"]["gpus"]) == (2, 0), train["cost"]
    assert train["slurm_job_id"] not in killed  # the attempt that finished
    # The profile's interconnect settings (tests/cluster/profile: set-resources: train) reached both nodes' ranks
    # through the job's environment and srun, and the manifest records what the ranks saw.
    assert train["interconnect"]["NCCL_DEBUG"] == "WARN", train["interconnect"]
    assert log.count("[launch] interconnect: ") == 2 and "NCCL_DEBUG=WARN" in log, log[-3000:]
    invocation = json.loads((checkout / "results/.stage-config/invocation.json").read_text())
    assert json.loads((cluster_run / "report/provenance.json").read_text())["invocation"] == invocation
    lines = run(["videogrpo", "trace", str(cluster_run)], checkout).stdout.splitlines()
    trace = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert trace["train"][1:3] == [train["slurm_job_id"], "COMPLETED"] and trace["fetch_model"][1] == "-"


def output_files(checkout: Path) -> dict[str, bytes]:
    """Every file the stages wrote (not the run-start records, the digest cache or the scheduler's logs)."""
    skipped = (".stage-config", "slurm-logs", ".checked-digests.json")
    return {
        str(p.relative_to(checkout)): p.read_bytes()
        for p in sorted((checkout / "results").rglob("*"))
        if p.is_file() and not any(part in skipped for part in p.relative_to(checkout / "results").parts)
    }


def test_a_failed_submission_costs_no_output_and_a_silent_scheduler_stops_the_run(slurm, checkout, tmp_path):
    """After the two-node run, every output complete: a resubmission of the score cells that sbatch refuses (memory
    no node has) fails, and every output, the cells' included, is as it was; a plain dry run then has nothing to do.
    With a controller that does not answer, the run stops in one line before anything is submitted."""
    before = output_files(checkout)
    assert sum(path.endswith("score_cell.manifest.json") for path in before) == len(CELLS)  # both models' cells
    refused = ["--forcerun", "score_cell", "--set-resources", "score_cell:mem_mb=1000000"]
    out = run(["snakemake", *TEST_PROFILE, *refused], checkout, check=False)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "SLURM sbatch failed" in said, said[-4000:]
    assert "Removing output files of failed job" not in said, said[-4000:]
    assert "score_cell (" in said and "failed before it started: its" in said, said[-4000:]
    assert output_files(checkout) == before
    # Snakemake's records are as they were: nothing is out of date, nothing is marked incomplete.
    assert "Nothing to be done" in run(["snakemake", "-n", *TEST_PROFILE], checkout).stdout

    dead = tmp_path / "slurm.conf"
    port = free_port()  # nothing listens there
    dead.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={port}", SYSTEM_CONF.read_text()))
    out = run(["snakemake", *TEST_PROFILE, "--forcerun", "score_cell"], checkout, check=False, SLURM_CONF=str(dead))
    said = out.stdout + out.stderr
    assert out.returncode != 0, said[-4000:]
    (line,) = [line for line in said.splitlines() if "the SLURM controller does not answer" in line]
    assert "nothing was submitted and every output is as it was" in line and "sbatch" not in said, said[-4000:]
    assert output_files(checkout) == before


def squeue_train_job() -> str | None:
    out = subprocess.run(["squeue", "-h", "-o", "%i %k %T"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        job_id, comment, state = line.split(maxsplit=2)
        if "rule_train" in comment and state == "RUNNING":
            return job_id
    return None


def kill_when_checkpointed(checkout: Path, driver: subprocess.Popen, output: Path) -> int:
    """scancel the running training job once its run has a complete checkpoint; returns the checkpoint's update."""
    deadline, seen = time.monotonic() + 300, []
    while time.monotonic() < deadline and driver.poll() is None:
        # Complete checkpoints of a run still training.
        updates = [
            int(m.parent.name.removeprefix("step-"))
            for m in checkout.glob("results/runs/*/checkpoints/step-*/COMPLETE")
            if not (m.parents[2] / "train/final").exists()
        ]
        job = squeue_train_job()
        seen.append((max(updates, default=0), job))
        if job and updates:
            subprocess.run(["scancel", job], check=True)
            return max(updates)
        time.sleep(0.1)
    raise AssertionError(
        f"never saw a running training job with a checkpoint: {seen[-20:]}\n{output.read_text()[-4000:]}"
    )


def test_one_node_trains_while_the_other_rolls_out_asynchronously(slurm, checkout):
    """Rollout actors across the cluster's nodes: the tiny default with `actors: {train_nodes: 1, asynchronous:
    true}` through the SLURM profile to its report. One node's rank trains, the other's rolls out and scores one batch
    ahead (the automatic prefetch with one actor: 2), so every update after the first replays rollouts one update
    old. The shared stages and the base model's cells are reused; this run's identity is its own."""
    before = set(checkout.glob("results/runs/*"))
    out = run(["snakemake", *TEST_PROFILE, "--config", "actors={train_nodes: 1, asynchronous: true}"], checkout)
    (run_dir,) = set(checkout.glob("results/runs/*")) - before
    jobs = jobs_run(out.stdout + out.stderr)
    assert {"train", "report"} <= set(jobs) and "preflight" in jobs and "fetch_model" not in jobs, jobs
    log = (run_dir / "logs/train.log").read_text()
    assert "ranks 0..0 train, ranks 1..1 (1) roll out and score, asynchronous, prefetch 2" in log, log[-3000:]
    # torchrun's rendezvous orders the nodes (node1 or node2 may get rank 0): one trains, the other rolls out.
    nodes = {rank: node for rank, node in re.findall(r"\[rank (\d)/\d\] host \S+ slurm node (node\d)", log)}
    assert sorted(nodes) == ["0", "1"] and nodes["0"] != nodes["1"], log[-3000:]
    assert "rollout actor of 1 train ranks" in log
    metrics = [json.loads(line) for line in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    staleness = [m["rollout_staleness"] for m in metrics]
    assert staleness[0] == 0 and set(staleness[1:]) == {1}, staleness  # within the bound: prefetch 2 - 1
    assert [m["rollout_policy_version"] for m in metrics] == [max(0, m["step"] - 2) for m in metrics]
    assert (run_dir / "report/provenance.json").is_file()
