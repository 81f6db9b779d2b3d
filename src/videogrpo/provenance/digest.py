"""File, tree and EvalKit source digests (SHA-256, lower-case hex).

Tree digest of a directory: one SHA-256 over its regular files in path-component order, per file the
4-byte big-endian length of the POSIX relative path, the path bytes, the 8-byte big-endian size and
the 32-byte SHA-256 of the content. Hashing per file first lets a manifest list every file and still
give one digest for the whole directory.
"""

from __future__ import annotations

import ast
import hashlib
import multiprocessing
import os
import struct
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from videogrpo.errors import VideoGRPOError

_CHUNK = 4 * 1024 * 1024


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def default_threads() -> int:
    """Hashing threads: the CPUs this process may use (hashlib releases the GIL on large buffers), at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """The syntax tree without its docstrings (every string statement of a body), changed in place."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [
                n
                for n in body
                if not (
                    isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                )
            ]
            node.body = kept or [ast.Pass()]
    return tree


def code_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a Python file's syntax tree without its docstrings: comments, docs and layout do not count,
    so that editing them is not mistaken for a change of what the code computes."""
    tree = strip_docstrings(ast.parse(Path(path).read_text(encoding="utf-8")))
    return sha256_bytes(ast.dump(tree, include_attributes=False).encode())


def _component_key(rel: str) -> str:
    # By components, as pathlib compares: "a/b.py" sorts before "a-b/c.py" although "-" < "/". Relative
    # paths here are normalized (no "." or empty components). NUL, which no path holds, sorts below every
    # character, so with it for "/" one string compares as the list of components would: the same order as
    # rel.split("/") at a fifth of the time and a third of the memory on a dataset's 250,000 files.
    return rel.replace("/", "\0")


# Snakemake's marker inside directory outputs: bookkeeping, not content.
SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"


def _is_partial(name: str) -> bool:
    return (name.startswith(".") and name.endswith(".tmp")) or name == SNAKEMAKE_TIMESTAMP


def list_files(root: str | os.PathLike, skip_partial: bool = True) -> list[str]:
    """Every regular file under `root` as a POSIX relative path, in path-component order.

    With `skip_partial`, temporary files of an interrupted atomic write (hidden, ending in .tmp) and
    Snakemake's timestamp marker are not part of the tree.
    """
    found: list[str] = []
    stack = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as it:
            for entry in it:
                if skip_partial and _is_partial(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):  # as os.walk: linked directories are not entered
                    stack.append((entry.path, f"{prefix}{entry.name}/"))
                elif entry.is_file():
                    found.append(prefix + entry.name)
    return sorted(found, key=_component_key)


_WHOLE_READ = 4 << 20  # files up to this size are read in one call (file_digest zeroes a 256 KiB buffer per file)


def _entry(path: str) -> tuple[str, int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size <= _WHOLE_READ:
            data = os.read(fd, size + 1)
            while len(data) <= size and (more := os.read(fd, size + 1 - len(data))):
                data += more
            return hashlib.sha256(data).hexdigest(), len(data)
        with os.fdopen(os.dup(fd), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest(), size
    finally:
        os.close(fd)


def tree_entries(
    root: str | os.PathLike,
    files: Iterable[str] | None = None,
    threads: int | None = None,
    known: dict[str, tuple[str, int]] | None = None,
) -> dict[str, tuple[str, int]]:
    """Map each file's relative path (all under root, or `files`) to (sha256, size), in path-component order.

    `known` holds entries the caller hashed while making or reading the files: those are reused, the
    other files listed are hashed.
    """
    root = os.fspath(root)
    names = list_files(root) if files is None else sorted(files, key=_component_key)
    if known:
        hashed = tree_entries(root, [rel for rel in names if rel not in known], threads)
        return {rel: known[rel] if rel in known else hashed[rel] for rel in names}
    threads = threads or default_threads()
    paths = [f"{root}/{rel}" for rel in names]
    if threads == 1 or len(names) < 2:
        return dict(zip(names, map(_entry, paths)))
    if len(names) >= _PROCESSES_FROM and "torch" not in sys.modules:
        # Many small files: per-file Python work holds the GIL, so threads barely overlap; forked
        # processes do (never after torch is imported: forking a process that holds CUDA or
        # OpenMP state is unsafe).
        chunks = [paths[i : i + _CHUNK_FILES] for i in range(0, len(paths), _CHUNK_FILES)]
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=threads, mp_context=context) as pool:
            return dict(zip(names, (e for chunk in pool.map(_entries, chunks) for e in chunk)))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(zip(names, pool.map(_entry, paths)))


_PROCESSES_FROM = 2048  # files; below this, starting processes costs more than it saves
_CHUNK_FILES = 256


def _entries(paths: list[str]) -> list[tuple[str, int]]:
    return [_entry(path) for path in paths]


def tree_digest_of_entries(entries: dict[str, tuple[str, int]]) -> str:
    h = hashlib.sha256()
    for rel in sorted(entries, key=_component_key):
        sha, size = entries[rel]
        path_bytes = rel.encode("utf-8")
        h.update(struct.pack(">I", len(path_bytes)))
        h.update(path_bytes)
        h.update(struct.pack(">Q", size))
        h.update(bytes.fromhex(sha))
    return h.hexdigest()


def tree_digest(root: str | os.PathLike) -> str:
    return tree_digest_of_entries(tree_entries(root))


def evalkit_files(root: str | os.PathLike) -> list[str]:
    """The files the VBVR EvalKit source digest covers, in digest order (docs/reference-system.md#rule-reward)."""
    root = Path(root)
    files = ["run_evaluation.py"]
    bench = root / "vbvr_bench"
    if bench.is_dir():
        files += [f"vbvr_bench/{rel}" for rel in list_files(bench, skip_partial=False) if rel.endswith(".py")]
    annotations = root / "annotations"
    if annotations.is_dir():
        files += [f"annotations/{rel}" for rel in list_files(annotations, skip_partial=False)]
    if (root / "requirements.txt").is_file():
        files.append("requirements.txt")
    return files


def digest_length_prefixed(root: Path, files: Iterable[str]) -> str:
    """SHA-256 over, per file, 4-byte path length, path, 8-byte content length, content."""
    h = hashlib.sha256()
    for rel in files:
        full = root / rel
        if not full.is_file():
            raise VideoGRPOError(f"{full}: listed for the EvalKit source digest but missing")
        path_bytes = rel.encode("utf-8")
        h.update(struct.pack(">I", len(path_bytes)))
        h.update(path_bytes)
        h.update(struct.pack(">Q", full.stat().st_size))
        with open(full, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def evalkit_source_digest(root: str | os.PathLike) -> str:
    return digest_length_prefixed(Path(root), evalkit_files(root))


def package_digest(package_dir: str | os.PathLike, parts: Iterable[str] = ("",)) -> str:
    """Digest of the Python sources (and shipped data) under the given parts of the package."""
    package_dir = Path(package_dir)
    entries: dict[str, tuple[str, int]] = {}
    for part in parts:
        target = package_dir / part
        if target.is_file():
            entries[part] = (sha256_file(target), target.stat().st_size)
            continue
        for rel in list_files(target):
            if "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            full = target / rel
            key = (Path(part) / rel).as_posix() if part else rel
            entries[key] = (sha256_file(full), full.stat().st_size)
    return tree_digest_of_entries(entries)
