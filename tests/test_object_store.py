"""The checkpoint mirror of a run in object storage (object_store.py), against moto's real S3 server on loopback."""

from __future__ import annotations

import shutil

import pytest

from videogrpo.grpo.checkpoint import MARKER
from videogrpo.grpo.checkpoint_mirror import CheckpointMirror, client, split_url, stored_checkpoints

BUCKET = "videogrpo-ckpt"


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "moto-dummy-key")
        env.setenv("AWS_SECRET_ACCESS_KEY", "moto-dummy-secret")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        client(url).create_bucket(Bucket=BUCKET)
        try:
            yield url
        finally:
            server.stop()


def write_checkpoint(root, step, complete=True, payload=b"weights"):
    step_dir = root / f"step-{step:08d}"
    (step_dir / "dcp").mkdir(parents=True)
    (step_dir / "dcp" / "__0_0.distcp").write_bytes(payload + bytes([step]))
    (step_dir / "state.json").write_text(f'{{"update": {step}}}')
    if complete:
        (step_dir / MARKER).write_text(f"step {step}\n")
    return step_dir


def objects(endpoint, prefix):
    s3 = client(endpoint)
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {item["Key"][len(prefix) :]: s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read() for item in listed}


def test_split_url_and_refusal():
    assert split_url("s3://b/some/prefix/") == ("b", "some/prefix")
    assert split_url("s3://b") == ("b", "")
    with pytest.raises(Exception, match="expected s3://<bucket>/<prefix>"):
        split_url("/local/path")


def test_complete_checkpoints_go_up_marker_last_and_come_back_on_another_node(s3_endpoint, tmp_path):
    url = f"s3://{BUCKET}/run-a/checkpoints"
    node1 = tmp_path / "node1"
    mirror = CheckpointMirror(url, node1, interval=0.05, endpoint_url=s3_endpoint)
    order = []
    upload = mirror.s3.upload_file
    mirror.s3.upload_file = lambda path, bucket, key: (order.append(key), upload(path, bucket, key))
    with mirror:
        (node1 / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')  # recorded before its checkpoint
        write_checkpoint(node1, 2)
        write_checkpoint(node1, 4, complete=False)  # being written when the job ends: never uploaded
    stored = objects(s3_endpoint, "run-a/checkpoints/")
    assert set(stored) == {
        "step-00000002/dcp/__0_0.distcp",
        "step-00000002/state.json",
        "step-00000002/COMPLETE",
        "metrics.jsonl",
    }
    assert (
        order[-1].endswith("step-00000002/COMPLETE") and order.index("run-a/checkpoints/metrics.jsonl") < len(order) - 1
    )
    # A fresh node: the newest complete checkpoint and the metrics so far, byte for byte.
    node2 = tmp_path / "node2"
    with CheckpointMirror(url, node2, endpoint_url=s3_endpoint) as fresh:
        assert sorted(p.relative_to(node2).as_posix() for p in node2.rglob("*") if p.is_file()) == sorted(stored)
        assert (node2 / "step-00000002/dcp/__0_0.distcp").read_bytes() == b"weights\x02"
        assert fresh.uploaded == {2}


def test_an_incomplete_checkpoint_in_the_bucket_is_never_restored(s3_endpoint, tmp_path):
    url = f"s3://{BUCKET}/run-b/checkpoints"
    s3 = client(s3_endpoint)
    s3.put_object(Bucket=BUCKET, Key="run-b/checkpoints/step-00000002/state.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key="run-b/checkpoints/step-00000002/COMPLETE", Body=b"step 2\n")
    s3.put_object(Bucket=BUCKET, Key="run-b/checkpoints/step-00000004/state.json", Body=b"{}")  # no marker
    assert set(stored_checkpoints(s3, BUCKET, "run-b/checkpoints")) == {2}
    mirror = CheckpointMirror(url, tmp_path / "node", endpoint_url=s3_endpoint)
    restored = mirror.restore()
    assert restored is not None and restored.name == "step-00000002"
    assert not (tmp_path / "node/step-00000004").exists()


def test_the_bucket_keeps_what_retention_keeps_and_a_newer_local_checkpoint_wins(s3_endpoint, tmp_path):
    url = f"s3://{BUCKET}/run-c/checkpoints"
    local = tmp_path / "node"
    mirror = CheckpointMirror(url, local, endpoint_url=s3_endpoint)
    local.mkdir()
    write_checkpoint(local, 2)
    mirror.sync()
    write_checkpoint(local, 4)
    shutil.rmtree(local / "step-00000002")  # the trainer's retention (train.keep_checkpoints: 1)
    mirror.sync()
    assert {k.split("/")[0] for k in objects(s3_endpoint, "run-c/checkpoints/")} == {"step-00000004"}
    # A local checkpoint as new as the bucket's: nothing is downloaded over it.
    assert CheckpointMirror(url, local, endpoint_url=s3_endpoint).restore() is None
