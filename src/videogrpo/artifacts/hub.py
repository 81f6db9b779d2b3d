"""Pinned snapshots from the Hugging Face Hub: a 40-hex revision or nothing, and every byte checked.

The Hub lists each file of a commit with its size and either its LFS SHA-256 (large files) or its git
blob id; huggingface_hub downloads without checking either. Every downloaded file is hashed once,
compared with what the Hub listed, and the SHA-256s are returned for the stage manifest to reuse. A
file that differs is deleted (so a rerun downloads it again) and the download fails naming it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from videogrpo.config import revision_problem
from videogrpo.errors import ConfigError, DigestMismatch, VideoGRPOError
from videogrpo.progress import Progress
from videogrpo.provenance.digest import default_threads


@dataclass(frozen=True)
class ListedFile:
    """A file as the Hub lists it at a commit."""

    path: str
    size: int
    lfs_sha256: str | None
    """SHA-256 of the content, for files stored in LFS."""
    git_blob_id: str
    """git's object id of the content (of the LFS pointer, for LFS files)."""


def _hash_file(path: Path, with_git_blob: bool) -> tuple[str, int, str | None]:
    """SHA-256, size and (for plain git files) the git blob id, in one read."""
    sha256 = hashlib.sha256()
    size = path.stat().st_size
    blob = hashlib.sha1(b"blob %d\0" % size) if with_git_blob else None
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha256.update(chunk)
            if blob is not None:
                blob.update(chunk)
    return sha256.hexdigest(), size, blob.hexdigest() if blob else None


def hub_token() -> str | bool:
    """$HF_TOKEN, or False: huggingface_hub then sends no token at all (not a stored login's)."""
    return os.environ.get("HF_TOKEN") or False


def list_files(repo_id: str, revision: str, repo_type: str, allow_patterns: list[str] | None) -> list[ListedFile]:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    tree = HfApi().list_repo_tree(repo_id, revision=revision, repo_type=repo_type, recursive=True, token=hub_token())
    files = [entry for entry in tree if isinstance(entry, RepoFile)]
    chosen = filter_repo_objects(files, allow_patterns=allow_patterns, key=lambda entry: entry.path)
    return [ListedFile(f.path, f.size, f.lfs.sha256 if f.lfs else None, f.blob_id) for f in chosen]


def verify_download(root: Path, listed: list[ListedFile], label: str) -> dict[str, tuple[str, int]]:
    """Hash every listed file under root and compare it with the Hub's listing; (sha256, size) per path.

    A file that differs is deleted, so the next run downloads it again; files the listing does not name
    are removed (they belong to no file of this commit).
    """
    wanted = {f.path: f for f in listed}
    for rel in [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]:
        if rel not in wanted:
            (root / rel).unlink()
    missing = sorted(rel for rel in wanted if not (root / rel).is_file())
    if missing:
        raise VideoGRPOError(f"{label}: the download lacks {missing[:5]}; rerun to resume it")
    with ThreadPoolExecutor(max_workers=default_threads()) as pool:
        found = dict(zip(wanted, pool.map(lambda f: _hash_file(root / f.path, f.lfs_sha256 is None), listed)))
    bad = []
    for rel, (sha256, size, blob) in found.items():
        want = wanted[rel]
        if _holds_listed((sha256, size, blob), want):
            continue
        got, expected = (
            (sha256, want.lfs_sha256) if want.lfs_sha256 else (f"git blob {blob}", f"git blob {want.git_blob_id}")
        )
        bad.append(f"{rel}: {size} bytes, {got}; the Hub lists {want.size} bytes, {expected}")
        (root / rel).unlink()
    if bad:
        raise DigestMismatch(
            f"{label}: {len(bad)} downloaded files differ from what the Hub lists (deleted; rerun to download them "
            f"again):\n  " + "\n  ".join(bad)
        )
    return {rel: (sha256, size) for rel, (sha256, size, _) in found.items()}


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def _holds_listed(found: tuple[str, int, str | None], listed: ListedFile) -> bool:
    """Whether (sha256, size, git blob id) of a file are what the Hub lists: the LFS SHA-256, else the blob id."""
    sha256, size, blob = found
    return size == listed.size and (sha256 == listed.lfs_sha256 if listed.lfs_sha256 else blob == listed.git_blob_id)


def _download(listed: ListedFile, url: str, partial: Path, token: str | bool, progress: Progress) -> None:
    """One file into partial/, resuming a `.incomplete` file an interrupted run left (HTTP byte range).

    A `.incomplete` file already at its listed size (a run killed between its last byte and the rename) is
    hashed and promoted without a request: the Hub answers 416 to a range that starts at the end. A 416 to
    a range inside the listed size means the server holds fewer bytes than this partial file, which is
    then no prefix of the served file: it is downloaded again from byte 0, once, never left for a rerun
    that would send the same range again.
    """
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    target = partial / listed.path
    if target.is_file() and target.stat().st_size == listed.size:
        progress.update(listed.size)  # complete already; hashed with the rest afterwards
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".incomplete")
    start = part.stat().st_size if part.is_file() else 0
    if part.is_file() and start == listed.size and _holds_listed(_hash_file(part, listed.lfs_sha256 is None), listed):
        os.replace(part, target)
        progress.update(listed.size)
        return
    if start >= listed.size:  # as long as the listing says, or longer, yet not the listed bytes
        start = 0
    # The token goes with every request to the Hub (a gated repository answers nothing without it); LFS
    # files redirect to storage on another origin under a signed URL, and the token stays on the Hub, as
    # huggingface_hub's own downloads do.
    location = get_hf_file_metadata(url, token=token, retry_on_errors=True).location
    headers = build_hf_headers(token=token)
    if not _same_origin(url, location):
        headers.pop("authorization", None)
    while True:
        ranged = dict(headers, Range=f"bytes={start}-") if start else headers
        with get_session().stream("GET", location, headers=ranged, follow_redirects=True, timeout=60) as response:
            if start and response.status_code == 416:
                start = 0
                continue
            hf_raise_for_status(response)
            if start and response.status_code != 206:  # the server ignored the range: start over
                start = 0
            progress.update(start)
            with open(part, "ab" if start else "wb") as f:
                f.truncate(start)
                for chunk in response.iter_bytes(1 << 20):
                    f.write(chunk)
                    progress.update(len(chunk))
        break
    # A body cut short raises (httpx checks Content-Length and chunked framing), so here the server's answer
    # was whole: a size other than the listed one is the served file's, and resuming would only repeat it.
    got = part.stat().st_size
    if got != listed.size:
        part.unlink()
        raise DigestMismatch(
            f"{listed.path}: the server sent {got} bytes in all, the Hub lists {listed.size}; the file it serves "
            f"is not the listed one (deleted: a rerun downloads it again from byte 0)"
        )
    os.replace(part, target)


def snapshot(
    repo_id: str, revision: str, out_dir: Path, repo_type: str = "model", allow_patterns: list[str] | None = None
) -> dict[str, tuple[str, int]]:
    """Download repo_id at a pinned commit into out_dir, renaming into place when complete and verified.

    Returns (sha256, size) of every file. The partial download lives beside out_dir, never in a path
    Snakemake deletes on failure, and a rerun resumes every file where it stopped (huggingface_hub's own
    snapshot_download restarts interrupted files from byte 0 since it writes per-process temporary
    files). The token, if any, comes from $HF_TOKEN only and goes with every request to the Hub; it is never
    written anywhere (a manifest refuses it, and no message or file name holds it).
    """
    if why := revision_problem(f"revision of {repo_id}", revision):
        raise ConfigError(why)
    from huggingface_hub import hf_hub_url
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    label = f"{repo_type} {repo_id}@{revision}"
    partial = out_dir.parent / f".{out_dir.name}.partial"
    token = hub_token()
    try:
        listed = list_files(repo_id, revision, repo_type, allow_patterns)
        if not listed:
            raise VideoGRPOError(f"{label}: no file matches {allow_patterns}; check the patterns (data.archive_glob)")
        progress = Progress(f"download {repo_id}", total=sum(f.size for f in listed), unit="B")
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [
                pool.submit(
                    _download,
                    f,
                    hf_hub_url(repo_id, f.path, repo_type=repo_type, revision=revision),
                    partial,
                    token,
                    progress,
                )
                for f in listed
            ]
            for future in futures:
                future.result()
        progress.finish()
    except GatedRepoError as err:
        given = "the token in $HF_TOKEN has no access" if token else "$HF_TOKEN is not set"
        raise VideoGRPOError(
            f"{label}: a gated repository, and {given} ({err.response.status_code} {err.server_message}); accept its "
            f"terms on the Hub with your account, then export HF_TOKEN with a token of that account and rerun"
        ) from None
    except (RevisionNotFoundError, RepositoryNotFoundError) as err:
        raise VideoGRPOError(
            f"{label}: not found on the Hub ({err}); check the id and revision, and $HF_TOKEN for gated repositories"
        ) from None
    except (HfHubHTTPError, OSError) as err:
        raise VideoGRPOError(f"{label}: download failed ({err}); rerun to resume") from None
    except Exception as err:  # httpx transport errors: a dropped connection or a timeout
        if type(err).__module__.split(".")[0] not in ("httpx2", "httpx", "httpcore"):
            raise
        raise VideoGRPOError(f"{label}: download failed ({type(err).__name__}: {err}); rerun to resume") from None
    entries = verify_download(partial, listed, label)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(partial, out_dir)
    return entries
