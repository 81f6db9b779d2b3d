"""Pinned snapshots from the Hugging Face Hub: a 40-hex revision or nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from videogrpo.config import HEX40
from videogrpo.errors import ConfigError, VideoGRPOError


def snapshot(
    repo_id: str, revision: str, out_dir: Path, repo_type: str = "model", allow_patterns: list[str] | None = None
) -> Path:
    """Download repo_id at a pinned commit into out_dir, resumably, renaming into place when complete.

    The partial download lives beside out_dir (huggingface_hub resumes it there), never in a path
    Snakemake deletes on failure. The token, if any, comes from $HF_TOKEN only.
    """
    if not HEX40.match(revision):
        raise ConfigError(
            f"revision {revision!r} of {repo_id}: must be a 40-hex commit id; branch and tag names "
            f"move, so a pinned pipeline refuses them"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    partial = out_dir.parent / f".{out_dir.name}.partial"
    try:
        snapshot_download(
            repo_id=repo_id,
            revision=revision,
            repo_type=repo_type,
            local_dir=str(partial),
            allow_patterns=allow_patterns,
            token=os.environ.get("HF_TOKEN") or None,
        )
    except (RevisionNotFoundError, RepositoryNotFoundError) as err:
        raise VideoGRPOError(
            f"{repo_type} {repo_id}@{revision}: not found on the Hub ({err}); check the id and "
            f"revision, and $HF_TOKEN for gated repositories"
        ) from None
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        raise VideoGRPOError(f"{repo_type} {repo_id}@{revision}: download failed ({err}); rerun to resume") from None
    # huggingface_hub keeps its resume bookkeeping inside local_dir; it is not part of the snapshot.
    shutil.rmtree(partial / ".cache", ignore_errors=True)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(partial, out_dir)
    return out_dir
