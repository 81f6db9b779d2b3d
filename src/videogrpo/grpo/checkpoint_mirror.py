"""Training checkpoints in an S3 bucket, for runs whose artifacts live in object storage (docs/object-storage.md).

With `--default-storage-provider s3`, Snakemake gives a job local copies of its inputs and uploads its declared
outputs once the job has succeeded. Checkpoints are no declared output (a rerun would delete them), and a job
that is killed uploads nothing, so without this module a resubmitted job on another node (or after the local
copies were cleaned) would find no checkpoint and train from the start. `CheckpointMirror` runs in the training
stage's process beside the trainer: before training it brings the bucket's newest complete checkpoint into the
local checkpoint directory (where the trainer resumes from it), and while training it uploads every checkpoint
as soon as its completion marker exists, the marker last, so that a checkpoint in the bucket is complete
exactly when its marker is there (as on a file system, checkpoint.py). The files directly in the checkpoint
directory (the trainer's metrics so far, which a resumed run trims to its checkpoint) go up with each
checkpoint, before its marker: the trainer records an update's metrics before it checkpoints that update.

The endpoint and credentials come from the environment, as for Snakemake's S3 plugin
(SNAKEMAKE_STORAGE_S3_ENDPOINT_URL, SNAKEMAKE_STORAGE_S3_ACCESS_KEY / _SECRET_KEY, or boto3's own AWS_*
variables and files): never from a command line, so never in a manifest.
"""

from __future__ import annotations

import os
import posixpath
import re
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

from videogrpo.errors import VideoGRPOError
from videogrpo.grpo.checkpoint import MARKER, complete_checkpoints

_STEP_DIR = re.compile(r"^step-(\d{8})$")


def split_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix) of an `s3://bucket/prefix` URL, the prefix without a trailing slash."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise VideoGRPOError(f"--checkpoint-store {url!r}: expected s3://<bucket>/<prefix>")
    return parsed.netloc, posixpath.normpath(parsed.path.lstrip("/")) if parsed.path.strip("/") else ""


def client(endpoint_url: str | None = None):
    """A boto3 S3 client configured as Snakemake's S3 plugin is, from the same environment variables."""
    import boto3
    from botocore.config import Config as BotoConfig

    env = os.environ.get
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or env("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL") or None,
        region_name=env("SNAKEMAKE_STORAGE_S3_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1",
        aws_access_key_id=env("SNAKEMAKE_STORAGE_S3_ACCESS_KEY") or None,
        aws_secret_access_key=env("SNAKEMAKE_STORAGE_S3_SECRET_KEY") or None,
        aws_session_token=env("SNAKEMAKE_STORAGE_S3_TOKEN") or None,
        # As the plugin does: a checksum trailer on uploads corrupts objects on S3 servers other than AWS's.
        config=BotoConfig(
            retries={"max_attempts": 5, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return keys


def stored_checkpoints(s3, bucket: str, prefix: str) -> dict[int, list[str]]:
    """Step -> keys of each complete checkpoint under the prefix (its marker is there)."""
    steps: dict[int, list[str]] = {}
    for key in _keys(s3, bucket, f"{prefix}/" if prefix else ""):
        parts = key[len(prefix) :].lstrip("/").split("/")
        match = _STEP_DIR.match(parts[0])
        if match and len(parts) > 1:
            steps.setdefault(int(match.group(1)), []).append(key)
    return {step: keys for step, keys in steps.items() if any(k.endswith(f"/{MARKER}") for k in keys)}


class CheckpointMirror:
    """Keeps a local checkpoint directory and `s3://bucket/prefix` in step (see the module docstring).

    `interval`: seconds between looks at the local directory; a checkpoint completed longer than that before
    the job is killed is in the bucket. The bucket keeps what the trainer's retention keeps: a checkpoint
    older than the newest local one and gone from the local directory is removed from the bucket too.
    """

    def __init__(self, url: str, local: Path, interval: float = 1.0, endpoint_url: str | None = None):
        self.bucket, self.prefix = split_url(url)
        self.url = url.rstrip("/")
        self.local = Path(local)
        self.interval = interval
        self.s3 = client(endpoint_url)
        self.uploaded: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def restore(self) -> Path | None:
        """Download the bucket's newest complete checkpoint unless the local directory has it or a newer one."""
        stored = stored_checkpoints(self.s3, self.bucket, self.prefix)
        self.uploaded = set(stored)
        local = [int(_STEP_DIR.match(p.name).group(1)) for p in complete_checkpoints(self.local)]
        if not stored or max(stored) <= max(local, default=0):
            return None
        step = max(stored)
        target = self.local / f"step-{step:08d}"
        keys = sorted(stored[step], key=lambda k: k.endswith(f"/{MARKER}"))  # the marker last
        beside = [k for k in _keys(self.s3, self.bucket, self._key("")) if "/" not in k[len(self._key("")) :]]
        for key in beside + keys:
            path = self.local / key[len(self.prefix) :].lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            self.s3.download_file(self.bucket, key, str(path))
        print(f"[object-store] restored {self.url}/{target.name} into {target}", file=sys.stderr, flush=True)
        return target

    def sync(self) -> None:
        """Upload each complete local checkpoint the bucket lacks (marker last); prune what retention dropped."""
        complete = {int(_STEP_DIR.match(p.name).group(1)): p for p in complete_checkpoints(self.local)}
        for step, path in sorted(complete.items()):
            if step in self.uploaded:
                continue
            files = sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.name == MARKER)
            beside = sorted(p for p in self.local.iterdir() if p.is_file())
            for file in files[:-1] + beside + files[-1:]:
                self.s3.upload_file(str(file), self.bucket, self._key(file.relative_to(self.local).as_posix()))
            self.uploaded.add(step)
            print(f"[object-store] uploaded {path.name} to {self.url}/{path.name}", file=sys.stderr, flush=True)
        if complete:
            for step in sorted(s for s in self.uploaded if s < max(complete) and s not in complete):
                # The marker first: a checkpoint half deleted must never look complete.
                keys = sorted(
                    _keys(self.s3, self.bucket, self._key(f"step-{step:08d}/")),
                    key=lambda k: not k.endswith(f"/{MARKER}"),
                )
                for key in keys:
                    self.s3.delete_object(Bucket=self.bucket, Key=key)
                self.uploaded.discard(step)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as err:  # a network hiccup or a checkpoint pruned while listed: the next look retries
                print(f"[object-store] sync of {self.local} failed, retrying: {err}", file=sys.stderr, flush=True)

    def __enter__(self) -> CheckpointMirror:
        self.local.mkdir(parents=True, exist_ok=True)
        self.restore()
        self._thread = threading.Thread(target=self._watch, name="checkpoint-mirror", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.sync()  # also after a failure: its complete checkpoints are what a rerun resumes from
        except Exception as err:
            if exc_type is None:
                raise VideoGRPOError(
                    f"could not upload the checkpoints of {self.local} to {self.url} ({type(err).__name__}: {err}); "
                    f"check the endpoint and credentials (SNAKEMAKE_STORAGE_S3_* or AWS_* variables), then rerun"
                ) from err
