"""Digests of files already checked, trusted while each file's stamp is unchanged (`results/.checked-digests.json`).

A stage that presents or evaluates a model checks the model's files against the manifest of the stage that made
them, and the check at the start of a run checks the inputs of the jobs at risk. A model pipeline of tens of GB
would be hashed again by every one of them. So a file of a directory whose device, inode, size, modification and
change times are those of a digest recorded here earlier is trusted with that digest. The change time is set by
the kernel on every write and every `utime`, so a file rewritten in place, or restored with its old size and
modification time (`cp -p`, `rsync -a`, `tar x`), is hashed again. Only digests that passed their check are
recorded, never a wrong one; a cache that is absent, cut short or written over by a concurrent job loses only speed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from videogrpo import atomic
from videogrpo.provenance import digest

CACHE_NAME = ".checked-digests.json"


def cache_path(results: str | os.PathLike) -> Path:
    """The cache of a results tree."""
    return Path(results) / CACHE_NAME


def load(path: Path | None) -> dict[str, list]:
    try:
        cache = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):  # absent, or cut short by a crash: only a speed-up is lost
        return {}
    return cache if isinstance(cache, dict) else {}


def entries(root: Path, cache: dict[str, list], seen: dict[str, list]) -> dict[str, tuple[str, int]]:
    """(sha256, size) of every file of directory `root`, reusing the cached digest of each file whose stamp matches;
    what was hashed or reused is added to `seen` (manifest.describe_cached makes the record of them)."""
    known, stats = {}, {}
    for rel in digest.list_files(root):
        full = os.path.abspath(root / rel)
        st = os.stat(full)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        stats[rel] = (full, st.st_size, stamp)
        hit = cache.get(full)
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == stamp:
            known[rel] = (hit[1], st.st_size)
    found = digest.tree_entries(root, known=known)
    for rel, (sha, size) in found.items():
        full, st_size, stamp = stats.get(rel, (None, None, None))
        if full and st_size == size:
            seen[full] = [stamp, sha]
    return found


def save(path: Path | None, seen: dict[str, list]) -> None:
    """Add digests that passed their check to the cache."""
    if path and seen:
        atomic.write_json(path, {**load(path), **seen})
