"""Object storage end to end: the tiny default up to training with every artifact in an S3 bucket.

moto's real S3 server on loopback stands in for the bucket; Snakemake's S3 storage plugin moves the files. One
run, shared by the tests of this module: training is SIGKILLed (the driver and its jobs) once a checkpoint is
in the bucket, the checkout loses everything local (`.snakemake/` with its local copies, and `results/`), as a
fresh node would have nothing, and the same command reruns: it must resume from the bucket's checkpoint and
end with the same manifests, digest for digest, as the file-system demo (conftest's session fixture).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from demo import VENV, copy_checkout, first_run_id, run, train_digest

pytestmark = pytest.mark.e2e

BUCKET, PREFIX = "videogrpo-runs", "tiny"
# As the README says: endpoint and credentials in the environment (dummy values for moto), never on the line.
COMMAND = shlex.split(
    "snakemake --cores 2 --default-storage-provider s3 --default-storage-prefix s3://videogrpo-runs/tiny train"
)
# The stages of that target, as the demo made them on a file system.
STAGES = {
    "fetch_model": "models/*/fetch_model.manifest.json",
    "fetch_dataset": "data/*/fetch_dataset.manifest.json",
    "materialize_dataset": "data/*/materialize_dataset.manifest.json",
    "validate_dataset": "data/*/validate_dataset.manifest.json",
    "fingerprint_evalkit": "evalkit/*/fingerprint_evalkit.manifest.json",
    "check_scorer_runtime": "evalkit/*/check_scorer_runtime.manifest.json",
    "preflight": "runs/{run}/preflight.manifest.json",
    "train": "runs/{run}/train.manifest.json",
}
# What differs between any two runs of a stage (when, where, how it was called), and the git state of a
# checkout copy; every digest, size, param and summary value must not.
# What differs between two runs of the same stage: when, where, how it was invoked, and what it cost (measured).
VARYING = ("started_at", "ended_at", "duration_s", "host", "command", "git", "slurm", "slurm_job_id", "cost")
LOCAL_COPIES = f".snakemake/storage/s3/{BUCKET}/{PREFIX}/"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free loopback port, the bucket, and the environment a user would set."""
    from moto.server import ThreadedMotoServer

    from videogrpo.grpo.checkpoint_mirror import client

    env = {"AWS_ACCESS_KEY_ID": "moto-dummy-key-id", "AWS_SECRET_ACCESS_KEY": "moto-dummy-secret-key"}
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env["SNAKEMAKE_STORAGE_S3_ENDPOINT_URL"] = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        s3 = client()
        s3.create_bucket(Bucket=BUCKET)
        try:
            yield s3, env
        finally:
            server.stop()


def keys(s3, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/{prefix}")
    return [item["Key"][len(PREFIX) + 1 :] for page in pages for item in page.get("Contents", [])]


def read(s3, rel: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{rel}")["Body"].read()


def kill_when_a_checkpoint_is_in_the_bucket(s3, checkout: Path, env: dict) -> str:
    """Start the run, SIGKILL the driver and every job of it once a complete checkpoint is in the bucket; the key."""
    log = open(checkout / "killed-run.log", "w")
    driver = subprocess.Popen(
        COMMAND,
        cwd=checkout,
        env=dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", WANDB_MODE="offline", **env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the kill takes torchrun and its workers too
    )
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and driver.poll() is None:
            markers = [k for k in keys(s3, "results/runs/") if "/checkpoints/step-" in k and k.endswith("/COMPLETE")]
            if markers:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
                return markers[0]
            time.sleep(0.1)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        log.close()
    raise AssertionError(f"no checkpoint reached the bucket:\n{(checkout / 'killed-run.log').read_text()[-4000:]}")


@pytest.fixture(scope="module")
def bucket_run(s3, tmp_path_factory):
    s3, env = s3
    checkout = copy_checkout(tmp_path_factory.mktemp("s3-checkout"))
    marker = kill_when_a_checkpoint_is_in_the_bucket(s3, checkout, env)
    run_id = first_run_id(checkout)
    assert f"results/runs/{run_id}/train.manifest.json" not in keys(s3), "killed too late: training had finished"
    # A fresh node: nothing local survives, not even Snakemake's record of the killed job or its lock.
    shutil.rmtree(checkout / ".snakemake")
    shutil.rmtree(checkout / "results")
    resumed = run(COMMAND, checkout, **env)
    return s3, checkout, run_id, marker, resumed


def normalized(manifest: dict) -> dict:
    """A manifest without what differs between runs, its paths as the file system run has them."""
    text = json.dumps({k: v for k, v in manifest.items() if k not in VARYING}, sort_keys=True)
    return json.loads(text.replace(LOCAL_COPIES, ""))


# Files that write down a path they were given, so that in object storage they name the local copy: the
# unpack's record of the manifest it checked the archives against, and the trained transformer's config (the
# base model's folder, as diffusers records it). Their bytes must differ from the file system run's by that
# prefix and nothing else.
RECORDS_A_PATH = {"materialization.json", "transformer/config.json"}


def as_on_a_file_system(s3, record: dict, expected: dict, fixed: list[str]) -> dict:
    """The bucket's record of a file or directory, each file whose digest differs from `expected` replaced by its
    bytes without the local-copy prefix (named in `fixed`); a directory's size and tree digest recomputed."""
    from videogrpo.provenance.digest import sha256_bytes, tree_digest_of_entries

    rel = record["path"].removeprefix(LOCAL_COPIES)

    def without_prefix(path: str, name: str) -> list:
        fixed.append(name)
        data = read(s3, path).replace(LOCAL_COPIES.encode(), b"")
        return [sha256_bytes(data), len(data)]

    if record["kind"] == "file":
        if record["sha256"] == expected.get("sha256"):
            return record
        sha, size = without_prefix(rel, Path(rel).name)
        return dict(record, sha256=sha, size=size)
    entries = dict(record.get("entries", {}))
    for name, (sha, _) in record.get("entries", {}).items():
        if expected.get("entries", {}).get(name, [None])[0] != sha:
            entries[name] = without_prefix(f"{rel}/{name}", name)
    if entries == record.get("entries", {}):
        return record
    return dict(
        record,
        entries=entries,
        size=sum(size for _, size in entries.values()),
        tree_sha256=tree_digest_of_entries({name: tuple(e) for name, e in entries.items()}),
    )


def untimed(metrics: bytes) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time_")} for line in metrics.splitlines()]


def test_every_artifact_up_to_training_lives_in_the_bucket(bucket_run):
    s3, checkout, run_id, _, _ = bucket_run
    stored = keys(s3)
    run_dir = f"results/runs/{run_id}"
    for prefix in (
        "results/models/tiny-",  # the model snapshot (a directory output)
        "results/data/synthetic-",  # archives, raw/, the index files
        f"{run_dir}/train/final/transformer/",
        f"{run_dir}/checkpoints/step-",
    ):
        assert any(k.startswith(prefix) for k in stored), (prefix, stored[:20])
    assert any("/materialized/raw/" in k for k in stored)
    for name in ("train/metrics.jsonl", "logs/train.log", "preflight.json", "train.manifest.json"):
        assert f"{run_dir}/{name}" in stored
    # Locally only what a run writes when it starts (each stage's config, the invocation), no artifact.
    local = {p.relative_to(checkout / "results").parts[0] for p in (checkout / "results").rglob("*") if p.is_file()}
    assert local <= {".stage-config"}, local


def test_manifests_and_digests_equal_the_file_system_run(bucket_run, demo, workdir):
    """Every digest, size, param and summary value of every stage up to training equals the demo's; a file that
    records a path differs by the local-copy prefix only, the metrics by their timings only; the preflight report
    (it reports the free disk space of the moment) and the manifests read as inputs (their times) are left out."""
    s3, _, run_id, _, _ = bucket_run
    assert run_id == first_run_id(workdir)  # the same config and inputs: the same run
    fixed: list[str] = []
    for stage, pattern in STAGES.items():
        (on_disk,) = (workdir / "results").glob(pattern.format(run=run_id))
        rel = on_disk.relative_to(workdir).as_posix()
        in_bucket, file_system = json.loads(read(s3, rel)), json.loads(on_disk.read_text())
        for section in ("inputs", "outputs"):
            for name, record in list(in_bucket[section].items()):
                if record["path"].endswith((".manifest.json", "/preflight.json")):
                    del in_bucket[section][name], file_system[section][name]
                elif record["path"].endswith("/train/metrics.jsonl"):  # each update's timings differ
                    bucket_rel = record["path"].removeprefix(LOCAL_COPIES)
                    assert untimed(read(s3, bucket_rel)) == untimed((workdir / bucket_rel).read_bytes())
                    del in_bucket[section][name], file_system[section][name]
                else:
                    in_bucket[section][name] = as_on_a_file_system(s3, record, file_system[section][name], fixed)
        if stage == "preflight":  # in object storage preflight reads the splits as a declared input, checked too
            upstream = in_bucket["upstream"]
            in_bucket["upstream"] = [p for p in upstream if not p.endswith("/materialize_dataset.manifest.json")]
            assert len(upstream) == len(in_bucket["upstream"]) + 1, upstream
        if stage == "train":  # timings of the last update; the final checkpoint's digest, checked below
            for record in (in_bucket, file_system):
                last = record["summary"]["last"]
                record["summary"]["last"] = {k: v for k, v in last.items() if not k.startswith("time_")}
                record["summary"]["final_checkpoint"].pop("tree_sha256")
        assert normalized(in_bucket) == normalized(file_system), stage
        if stage == "train":
            assert in_bucket["outputs"]["final"]["tree_sha256"] == train_digest(workdir, run_id)  # as reconciled
            weights = "transformer/diffusion_pytorch_model.safetensors"
            bucket_final = json.loads(read(s3, rel))["outputs"]["final"]
            assert bucket_final["entries"][weights] == file_system["outputs"]["final"]["entries"][weights]
    assert set(fixed) == RECORDS_A_PATH, fixed


def test_training_resumed_from_the_checkpoint_in_the_bucket(bucket_run):
    s3, _, run_id, marker, resumed = bucket_run
    step = marker.split("/checkpoints/")[1].split("/")[0]
    log = read(s3, f"results/runs/{run_id}/logs/train.log").decode()
    assert f"[object-store] restored s3://{BUCKET}/{PREFIX}/results/runs/{run_id}/checkpoints/{step}" in log, log
    update = int(step.removeprefix("step-"))
    assert f"resumed from {LOCAL_COPIES}results/runs/{run_id}/checkpoints/{step} (update {update} of 4)" in log, log
    assert update < 4
    steps = [json.loads(line)["step"] for line in read(s3, f"results/runs/{run_id}/train/metrics.jsonl").splitlines()]
    assert steps == [1, 2, 3, 4]
    # Nothing upstream of training was made again: the rerun found it all in the bucket.
    table = (resumed.stdout + resumed.stderr).split("Job stats:")[1].split("Select jobs")[0]
    assert dict(re.findall(r"^(\w+)\s+(\d+)$", table, re.M)) == {"train": "1", "total": "1"}, table
    # The credentials were in the environment only: in no manifest of the bucket.
    for key in keys(s3):
        if key.endswith(".manifest.json"):
            text = read(s3, key).decode()
            assert "moto-dummy-secret-key" not in text and "moto-dummy-key-id" not in text, key
