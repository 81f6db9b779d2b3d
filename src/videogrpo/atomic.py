"""Atomic writes: every file appears under its final name complete or not at all."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary_sibling(path: Path, suffix: str = "") -> Path:
    # Same directory as the target, so the final rename never crosses a filesystem.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o666 & ~_umask())  # mkstemp makes 0600; the final file gets the usual permissions
    return Path(name)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it into place, on failure delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(path, suffix=path.suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) and not err.filename:
            err.filename = str(path)  # a write() names no file: the full disk's message must name one
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, compact: bool = False) -> None:
    """Indented for people to read, or `compact` (one line, through the C encoder: much faster for big records)."""
    if compact:
        write_text(path, json.dumps(obj, separators=(",", ":"), sort_keys=True, default=str) + "\n")
    else:
        write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _readable_as_usual(root: Path) -> None:
    """Give files written by libraries that create them private (safetensors: 0600) the usual permissions,
    so a group sharing `results/` can read every output."""
    mask = _umask()
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            file = Path(dirpath, name)
            mode = file.stat().st_mode & 0o777
            os.chmod(file, (mode | 0o666) & ~mask)  # keeps execute bits where they were


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory under a temporary name; rename it into place only when the body succeeds.

    An existing directory at `path` is replaced (moved aside first, then removed), so a reader never
    sees a mix of old and new files.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        _readable_as_usual(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
