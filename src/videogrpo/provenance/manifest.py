"""Stage manifests: what a stage made, from what, with which digests, where and when.

A manifest is written last and atomically, so its presence means the stage finished; downstream rules
take manifests as inputs, so a changed upstream digest reruns what depends on it.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from videogrpo import atomic
from videogrpo.errors import DigestMismatch, VideoGRPOError
from videogrpo.provenance import cost, digest, digest_cache, slurm_job

MANIFEST_VERSION = 1
MODEL_INPUT = "model:"
"""The prefix of the inputs that name a model a stage presents or evaluates (`model:<name>`), beside its data."""
SECRET_ENV_VARS = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "WANDB_API_KEY",
    # MLflow's credentials, and those of the object stores its artifacts may live in.
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_CLIENT_SECRET",
)
# Addresses that may carry credentials in their user part; without one they are no secret.
URI_ENV_VARS = ("MLFLOW_TRACKING_URI",)
TRACKED_PACKAGES = (
    "videogrpo",
    "torch",
    "diffusers",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "av",
    "numpy",
    "pillow",
    "pandas",
    "snakemake",
    "snakemake-executor-plugin-slurm",
    "wandb",
)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_state(repo: str | os.PathLike = ".") -> dict[str, Any] | None:
    """Commit, dirty state, changed and untracked files of the workflow checkout now (None outside git)."""

    def git(*args: str) -> str | None:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    changed, untracked = [], []
    entries = iter((git("status", "--porcelain=v1", "-z", "--untracked-files=all") or "").split("\0"))
    for entry in entries:
        if not entry:
            continue
        code, name = entry[:2], entry[3:]
        (untracked if code == "??" else changed).append(name)
        if code[0] in "RC":  # a rename or copy: the next entry is the original name
            next(entries, None)
    return {
        "commit": commit.strip(),
        "dirty": bool(changed or untracked),
        "changed_files": changed,
        "untracked_files": untracked,
    }


def accelerator_info() -> dict[str, Any] | None:
    """GPU model, CUDA, cuDNN, NCCL and driver versions, where the stage used torch (None otherwise)."""
    if "torch" not in sys.modules:  # light stages never pay for importing torch
        return None
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False}
    if torch.cuda.is_available():
        info.update(
            cuda_available=True,
            devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            out = subprocess.run(query, capture_output=True, text=True, check=False, timeout=30)
            info["driver"] = out.stdout.split("\n")[0].strip() or None
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = None
    return info


def describe(
    path: str | os.PathLike,
    list_files: bool,
    known: dict[str, tuple[str, int]] | None = None,
    complete: bool = False,
) -> dict[str, Any]:
    """Digest record of a file or directory; directories get a tree digest and, optionally, every file.

    `known` holds (sha256, size) of files the caller hashed while making or reading them (so no byte is
    hashed twice); the directory is still listed, and files it does not vouch for are hashed, unless
    `complete` says the caller has just listed it and `known` names every file.
    """
    path = Path(path)
    if path.is_dir():
        if known is None:
            entries = digest.tree_entries(path)
        elif complete:
            entries = dict(known)
        else:
            entries = digest.tree_entries(path, known=known)
        record: dict[str, Any] = {
            "path": str(path),
            "kind": "directory",
            "tree_sha256": digest.tree_digest_of_entries(entries),
            "files": len(entries),
            "size": sum(size for _, size in entries.values()),
        }
        if list_files:
            record["entries"] = {rel: [sha, size] for rel, (sha, size) in entries.items()}
        return record
    if path.is_file():
        return {"path": str(path), "kind": "file", "sha256": digest.sha256_file(path), "size": path.stat().st_size}
    raise VideoGRPOError(f"{path}: expected a file or directory for the manifest, found nothing")


def describe_cached(path: str | os.PathLike, cache: dict[str, list], seen: dict[str, list]) -> dict[str, Any]:
    """describe(path) without the file list, a directory's files through the digest cache (digest_cache.entries);
    what was hashed or reused is added to `seen`, for digest_cache.save once the record passed its check."""
    root = Path(path)
    if not root.is_dir():
        return describe(root, list_files=False)
    return describe(root, list_files=False, known=digest_cache.entries(root, cache, seen), complete=True)


def record_digest(record: dict[str, Any]) -> str:
    return record.get("sha256") or record["tree_sha256"]


def uri_secrets() -> list[tuple[str, str]]:
    """(variable, value) of what URI_ENV_VARS must never leave the environment with: a URI that embeds a user
    (`https://user:password@host`) as a whole, and its password."""
    found = []
    for var in URI_ENV_VARS:
        parts = urlsplit(os.environ.get(var, ""))
        if "@" in parts.netloc:
            found += [(var, parts.geturl()), *([(var, parts.password)] if parts.password else [])]
    return found


def secret_values() -> list[tuple[str, str]]:
    """(variable, value) of every secret the environment holds that is long enough to look for."""
    found = [(var, os.environ.get(var, "")) for var in SECRET_ENV_VARS] + uri_secrets()
    return [(var, value) for var, value in found if len(value) >= 8]


def assert_no_secrets(text: str, where: str, secrets: list[tuple[str, str]] | None = None) -> None:
    for var, value in secret_values() if secrets is None else secrets:
        if value in text:
            raise VideoGRPOError(
                f"{where}: refusing to write the value of ${var}; secrets travel only in the environment"
            )


_BLOCK = 1 << 20  # characters of a manifest written, and searched for secrets, at a time


def write_manifest(path: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """The manifest as indented JSON, streamed to disk a block at a time. The text of a dataset's manifest (every
    file of 250,000 listed) and the pieces Python's indenting encoder joins into it came to half of
    materialize_dataset's peak memory. Each block is searched for secrets together with the end of the one before,
    so a secret split between blocks is still found; a refused manifest leaves no file."""
    secrets = secret_values()
    overlap = max((len(value) for _, value in secrets), default=1) - 1
    pieces = json.JSONEncoder(indent=2, sort_keys=True, default=str).iterencode(manifest)
    with atomic.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        tail, block, size = "", [], 0
        for piece in itertools.chain(pieces, [None]):
            if piece is not None:
                block.append(piece)
                size += len(piece)
            if size >= _BLOCK or (piece is None and block):
                text = "".join(block) + ("\n" if piece is None else "")
                assert_no_secrets(tail + text, str(path), secrets)
                out.write(text)
                tail = (tail + text)[-overlap:] if overlap else ""
                block, size = [], 0
        out.flush()
        os.fsync(out.fileno())


# The workflow's default target names every stage's manifest: a plain rerun rebuilds a missing one.
REBUILD = "`snakemake --cores <N>` (a plain rerun rebuilds every stage whose manifest is missing)"


def stage_of(path: str | os.PathLike) -> str:
    """The stage a manifest belongs to, by its file name (`<stage>.manifest.json`)."""
    return Path(path).name.removesuffix(".manifest.json")


def read_manifest(path: str | os.PathLike, rebuild: str = REBUILD) -> dict[str, Any]:
    """A stage manifest, checked; `rebuild` is the command the refusal of a missing or broken one names (the run's
    own, where the caller knows which run it reads: provenance/rebuild.py)."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise VideoGRPOError(f"{path}: manifest of stage {stage_of(path)} missing; rebuild it with {rebuild}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise VideoGRPOError(
            f"{path}: manifest of stage {stage_of(path)} is not valid JSON ({err}), cut short or edited: "
            f"`rm {path}`, then {rebuild}"
        ) from None
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise VideoGRPOError(
            f"{path}: manifest_version {manifest.get('manifest_version')!r}, expected {MANIFEST_VERSION} (written by "
            f"another version): `rm {path}`, then {rebuild}"
        )
    return manifest


def upstream_outputs(upstream: list[Path]) -> dict[str, tuple[dict[str, Any], Path, str]]:
    """Absolute output path -> (its record, the manifest, the stage) for every output the manifests name."""
    recorded: dict[str, tuple[dict[str, Any], Path, str]] = {}
    for path in upstream:
        manifest = read_manifest(path)
        for record in manifest["outputs"].values():
            recorded[os.path.abspath(record["path"])] = (record, Path(path), manifest["stage"])
    return recorded


def _recorded_as(
    path: str, recorded: dict[str, tuple[dict[str, Any], Path, str]]
) -> tuple[str | None, dict[str, list] | None, Path, str] | None:
    """What an upstream manifest recorded for `path`: (digest, entries of a directory, manifest, stage).

    `path` is an output itself, or a file or directory inside a directory output (a trained cell reads
    `final/transformer` of train's `final`), whose digest then comes from that output's file list; a
    digest of None means the output lists no such file.
    """
    if path in recorded:
        expected, manifest_path, stage = recorded[path]
        return record_digest(expected), expected.get("entries"), manifest_path, stage
    for parent in Path(path).parents:
        match = recorded.get(str(parent))
        if match is None:
            continue
        expected, manifest_path, stage = match
        if "entries" not in expected:
            return None
        rel = Path(path).relative_to(parent).as_posix()
        entries = expected["entries"]
        if rel in entries:
            return entries[rel][0], None, manifest_path, stage
        inside = {name[len(rel) + 1 :]: v for name, v in entries.items() if name.startswith(rel + "/")}
        digest_of = digest.tree_digest_of_entries({n: (sha, size) for n, (sha, size) in inside.items()})
        return (digest_of if inside else None), inside, manifest_path, stage
    return None


def verify_inputs(
    records: dict[str, dict[str, Any]], upstream: list[Path], external: frozenset[str] = frozenset()
) -> None:
    """Every input an upstream manifest recorded as its output must still be byte for byte what it recorded.

    Raises DigestMismatch naming the input, the manifest, both digests and (for directories) the files
    that differ, so a hand-edited or corrupted file never flows into a later stage. A stage given upstream
    manifests refuses an input that none of them records, unless it names the input `external` (pinned by
    the config and checked where it is read): a record that cannot be found would otherwise skip the check
    without a word (a moved results directory, a rule that lost its upstream manifest).
    """
    recorded = upstream_outputs(upstream)
    manifests = {os.path.abspath(p) for p in upstream}
    for name, record in records.items():
        path = os.path.abspath(record["path"])
        if path in manifests:  # an upstream manifest itself: the record the others are checked against
            continue
        match = _recorded_as(path, recorded)
        if match is None:
            if name in external or not upstream:
                continue
            looked_in = ", ".join(f"{read_manifest(p)['stage']} ({p})" for p in upstream)
            raise DigestMismatch(
                f"{record['path']}: input {name} is recorded as an output by none of the upstream manifests "
                f"{looked_in}, so it cannot be checked against the stage that made it; give that stage's "
                f"manifest with --upstream (the rule's upstream(...) inputs), or rerun it so that its manifest "
                f"records this path (snakemake --forcerun <that stage>)"
            )
        expected_digest, expected_entries, manifest_path, stage = match
        if expected_digest == record_digest(record):
            continue
        detail = ""
        if record["kind"] == "directory" and expected_entries is not None:
            found = {rel: [sha, size] for rel, (sha, size) in digest.tree_entries(record["path"]).items()}
            differ = sorted(
                rel for rel in set(found) | set(expected_entries) if found.get(rel) != expected_entries.get(rel)
            )
            detail = f"\n  files that differ: {', '.join(differ[:10])}" + (" ..." if len(differ) > 10 else "")
        raise DigestMismatch(
            f"{record['path']}: input {name} is not what {stage} made ({manifest_path})\n"
            f"  recorded {expected_digest or '(no such file in its output)'}\n  found    {record_digest(record)}"
            f"{detail}\nRestore it, or rerun {stage} (snakemake --forcerun {stage}) to make it again."
        )


class StageRun:
    """One stage's provenance: inputs digested on entry, outputs on success, manifest written last.

    On failure nothing is written, so a failed stage never leaves a manifest that looks complete. Inputs
    that an upstream stage made are checked against its manifest before the stage starts; `external`
    names the inputs no upstream stage makes (an EvalKit checkout, a task list, a checkpoint to resume
    from), which are recorded but need no upstream record (see verify_inputs).
    """

    def __init__(
        self,
        stage: str,
        manifest_path: str | os.PathLike,
        inputs: dict[str, str | os.PathLike],
        params: dict[str, Any] | None = None,
        upstream: list[str | os.PathLike] | None = None,
        external: tuple[str, ...] = (),
        digest_cache: str | os.PathLike | None = None,
    ):
        self.stage = stage
        # Where the inputs' files checked before are trusted by their stamps (provenance/digest_cache.py): a stage
        # that checks a model it presents does not hash tens of GB again.
        self.digest_cache = Path(digest_cache) if digest_cache else None
        self.external = frozenset(external)
        self.manifest_path = Path(manifest_path)
        self.inputs = {name: Path(p) for name, p in inputs.items() if p}
        self.upstream = [Path(p) for p in upstream or []]
        self.params = params or {}
        self.outputs: dict[str, Path] = {}
        self.summary: dict[str, Any] = {}
        self._known: dict[str, tuple[dict[str, tuple[str, int]], bool]] = {}
        # (count, where it came from), set by a stage that knows its GPUs better than this process's view of
        # them (train: nodes x GPUs per node); `nodes` likewise.
        self.gpus: tuple[int, str] | None = None
        self.nodes = 1
        # The interconnect environment the stage's workers saw (interconnect.recorded), set by train: written only
        # when set, so the other stages' manifests are as they were.
        self.interconnect: dict[str, str] | None = None

    def __enter__(self) -> StageRun:
        self.started_at = now_iso()
        self._t0 = time.monotonic()
        self._cpu0 = cost.cpu_seconds()
        self.git = git_state()  # the checkout as it is when the stage starts, not when a report is made
        cache, seen = digest_cache.load(self.digest_cache), {}
        self.input_records = {
            name: describe_cached(p, cache, seen) if self.digest_cache else describe(p, list_files=False)
            for name, p in self.inputs.items()
        }
        verify_inputs(self.input_records, self.upstream, self.external)
        digest_cache.save(self.digest_cache, seen)
        return self

    def input(self, name: str, path: str | os.PathLike, known: dict[str, tuple[str, int]]) -> None:
        """An input the stage digested while reading it (not on entry), checked against upstream now."""
        record = describe(path, list_files=False, known=known)
        verify_inputs({name: record}, self.upstream, self.external)
        self.input_records[name] = record

    def output(
        self,
        name: str,
        path: str | os.PathLike,
        known: dict[str, tuple[str, int]] | None = None,
        complete: bool = False,
    ) -> Path:
        """Record an output; `known` and `complete` as in describe()."""
        self.outputs[name] = Path(path)
        if known is not None:
            self._known[name] = (known, complete)
        return self.outputs[name]

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        wall_s = time.monotonic() - self._t0
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "stage": self.stage,
            "command": sys.argv,
            "started_at": self.started_at,
            "ended_at": now_iso(),
            "duration_s": round(wall_s, 3),
            "cost": cost.measure(
                wall_s, tuple(b - a for a, b in zip(self._cpu0, cost.cpu_seconds())), self.gpus, self.nodes
            ),
            "host": socket.gethostname(),
            # Only a job SLURM confirms; what the environment claimed, and whether SLURM confirmed it, beside it.
            "slurm_job_id": slurm_job.confirmed_job_id(),
            "slurm_job": claimed.record() if (claimed := slurm_job.slurm_job()) is not None else None,
            "git": self.git,
            "slurm": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_")} or None,
            **({"interconnect": self.interconnect} if self.interconnect is not None else {}),
            "accelerator": accelerator_info(),
            "inputs": self.input_records,
            "upstream": [str(p) for p in self.upstream],
            "outputs": {name: describe(p, True, *self._known.get(name, (None,))) for name, p in self.outputs.items()},
            "params": self.params,
            "versions": package_versions(),
            "summary": self.summary,
        }
        write_manifest(self.manifest_path, manifest)
