"""`videogrpo check-inputs`: a stage's inputs checked before the stage's job starts (rule check_inputs).

Snakemake deletes a job's outputs before it runs the job, so a stage that refused its inputs itself would
already have cost its earlier, good outputs (a hand-edited table the whole report, a corrupted weight file
the evaluation). Every stage that reads what other stages made therefore takes the stamp of this check
as an input (a `temp()` file: made when the stage is about to run, even under --forcerun, and removed
after it): inputs not byte for byte what their upstream manifests record, a manifest cut short, an
EvalKit checkout or an evaluation tree not at its pinned digest stop the run here, and the stage's
outputs stay as they were. The stage checks its inputs again when it reads them.

This check may trust a file of a directory input whose device, inode, size, modification and change times
are those of the digest it recorded in `--digest-cache` at an earlier check: a model pipeline of tens of
GB is hashed once for all the matrix cells that read it, not once per cell. The change time is set by the
kernel on every write and every `utime`, so a restore that keeps the size and the modification time
(`cp -p`, `rsync -a`, `tar x`) is hashed again; the stage itself reads every byte anyway.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from videogrpo import atomic
from videogrpo.errors import DigestMismatch
from videogrpo.provenance import digest
from videogrpo.provenance.manifest import describe, now_iso, record_digest, verify_inputs


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", required=True, help="the stage whose inputs these are")
    parser.add_argument("--input", type=_pair, action="append", default=[], metavar="NAME=PATH", help="an input")
    parser.add_argument("--upstream", type=Path, action="append", default=[], help="an upstream stage's manifest")
    parser.add_argument(
        "--evalkit", type=_pair, action="append", default=[], metavar="PATH=DIGEST", help="an EvalKit and its pin"
    )
    parser.add_argument(
        "--tree", type=_pair, action="append", default=[], metavar="PATH=DIGEST", help="a tree and its pinned digest"
    )
    parser.add_argument("--out", required=True, type=Path, help="the stamp to write when every check passes")
    parser.add_argument(
        "--digest-cache", type=Path, help="file digests of earlier checks by path and stat (JSON), updated"
    )


def _load_cache(path: Path | None) -> dict[str, list]:
    try:
        cache = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):  # absent, or cut short by a crash: only a speed-up is lost
        return {}
    return cache if isinstance(cache, dict) else {}


def _describe(path: str, cache: dict[str, list], seen: dict[str, list]) -> dict[str, Any]:
    """describe(path), reusing the cached digest of each file of a directory whose size and mtime match."""
    root = Path(path)
    if not root.is_dir():
        return describe(root, list_files=False)
    known, stats = {}, {}
    for rel in digest.list_files(root):
        full = os.path.abspath(root / rel)
        st = os.stat(full)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        stats[rel] = (full, st.st_size, stamp)
        hit = cache.get(full)
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == stamp:
            known[rel] = (hit[1], st.st_size)
    entries = digest.tree_entries(root, known=known)
    for rel, (sha, size) in entries.items():
        full, st_size, stamp = stats.get(rel, (None, None, None))
        if full and st_size == size:
            seen[full] = [stamp, sha]
    return describe(root, list_files=False, known=entries, complete=True)


def run(args: argparse.Namespace) -> int:
    from videogrpo.rewards.evalkit import check_checkout, check_digest

    cache, seen = _load_cache(args.digest_cache), {}
    records = {name: _describe(path, cache, seen) for name, path in args.input}
    verify_inputs(records, args.upstream)
    if args.digest_cache and seen:  # only digests that passed; a concurrent check's entries may be lost, never wrong
        atomic.write_json(args.digest_cache, {**_load_cache(args.digest_cache), **seen})
    pins = {}
    for path, pinned in args.evalkit:
        pins[f"evalkit {path}"] = check_digest(check_checkout(path), pinned)
    for path, pinned in args.tree:
        found = digest.tree_digest(Path(path)) if Path(path).is_dir() else "no such directory"
        if found != pinned:
            raise DigestMismatch(
                f"{path}: tree SHA-256 {found}, but matrix.eval_set_digest pins {pinned}: the evaluation set "
                f"changed; restore it, or pin the new digest knowingly (the {args.stage} outputs are kept)"
            )
        pins[f"tree {path}"] = found
    stamp = {
        "stage": args.stage,
        "checked_at": now_iso(),
        "inputs": {name: record_digest(record) for name, record in records.items()},
        "upstream": [str(path) for path in args.upstream],
        "pins": pins,
    }
    atomic.write_json(args.out, stamp)
    checked = len(records) + len(args.upstream) + len(pins)
    print(f"{args.stage}: {checked} inputs, manifests and pins checked; the stage may run")
    return 0
