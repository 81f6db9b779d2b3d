"""The lock a killed Snakemake driver leaves, and whether a rerun may take it over.

Snakemake locks the files of a run in `.snakemake/locks/` (`<n>.input.lock`, `<n>.output.lock`: file names only,
no process or host) and removes the locks when it exits. A driver killed with `kill -9`, or whose machine went
down, leaves them, and the next run stops on Snakemake's LockException until someone runs `snakemake --unlock`,
which is safe only when no Snakemake and no job it started still runs on these files: the lock alone cannot say.

So each run records, beside its lock files (`record_driver`, from the workflow's `onstart`), who holds them: the
driver's pid, process group, host, boot, process start time and executor, and the lock files it found. When a
later run finds its files locked (`install`, where Snakemake takes the lock), a lock is taken over only when it is
provably stale: every record listing it is of a driver on this machine, in this boot, that is gone, whose jobs ran
locally (the `local` executor) and of whose process group nothing runs any more. Anything else (another host, a
cluster executor whose jobs may still run, a driver or a job still alive, a lock no record explains) stops the run
with a message naming the holder and when `snakemake --unlock` is safe.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from videogrpo import atomic
from videogrpo.pipeline import snakemake_patch

RECORD_PREFIX = "videogrpo-driver-"
UNLOCK_WHEN = (
    "`snakemake --unlock` is safe once no Snakemake runs in this directory (on any machine that shares it) and no "
    "job one started still runs: local jobs (`ps -eo pid,pgid,args | grep 'videogrpo stage'`), SLURM jobs "
    "(`squeue --me`), Kubernetes jobs (`kubectl get jobs`); then rerun"
)


def _lock_files(lockdir: Path) -> dict[str, list[int]]:
    """Snakemake's lock files, each with what tells it from a later one of the same name (inode, size, mtime)."""
    found = {}
    for path in sorted(lockdir.glob("*.lock")) if lockdir.is_dir() else []:
        number, _, kind = path.name.partition(".")
        if number.isdigit() and kind in ("input.lock", "output.lock"):
            st = path.stat()
            found[path.name] = [st.st_ino, st.st_size, st.st_mtime_ns]
    return found


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str | None:
    """The process's start time since boot (field 22 of /proc/<pid>/stat): a pid reused later has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """The processes of process group `pgid` on this machine, but this process and its ancestors."""
    mine = _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":  # a zombie runs nothing
                continue
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        found.append((int(entry.name), args or "?"))
    return sorted(found)


def record_driver(lockdir: str | os.PathLike, executor: str) -> Path | None:
    """Record this driver as the holder of the lock files in `lockdir` (Snakemake took them before `onstart`);
    None when there are none (--nolock). Snakemake removes the directory, this record with it, when it unlocks."""
    lockdir = Path(lockdir)
    locks = _lock_files(lockdir)
    if not locks or not sys.platform.startswith("linux"):
        return None
    host = socket.gethostname()
    record = {
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "host": host,
        "boot_id": _boot_id(),
        "start_ticks": _start_ticks(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "executor": executor,  # never the command line: it may hold a storage secret
        "locks": locks,
    }
    path = lockdir / f"{RECORD_PREFIX}{host}-{os.getpid()}.json"
    atomic.write_json(path, record)
    return path


@dataclass
class Holder:
    """One recorded driver and what is known of it now."""

    path: Path
    record: dict[str, Any]
    why_alive: list[str] = field(default_factory=list)  # empty: provably gone, its jobs too

    @property
    def gone(self) -> bool:
        return not self.why_alive

    def describe(self) -> str:
        r = self.record
        return f"the Snakemake driver pid {r.get('pid')} on {r.get('host')}, started {r.get('started')}"


def _judge(path: Path) -> Holder | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    holder = Holder(path, record)
    if record.get("host") != socket.gethostname():
        holder.why_alive.append(f"it ran on {record.get('host')}, so this machine cannot see whether it still runs")
        return holder
    rebooted = bool(record.get("boot_id")) and record.get("boot_id") != _boot_id()
    if rebooted:  # this machine restarted since: nothing of that boot runs; a cluster's jobs may still run
        if record.get("executor") != "local":
            holder.why_alive.append(f"its jobs ran under the {record.get('executor')} executor and may still run")
        return holder
    if _start_ticks(int(record.get("pid", 0))) == record.get("start_ticks"):
        holder.why_alive.append("it still runs")
        return holder
    if record.get("executor") != "local":
        holder.why_alive.append(f"its jobs ran under the {record.get('executor')} executor and may still run")
        return holder
    pgid = int(record.get("pgid", 0))
    if pgid <= 0:  # group 0 is the kernel's threads: no record of the driver's own
        holder.why_alive.append("its record names no process group, so its jobs cannot be seen")
        return holder
    left = _group_members(pgid)
    if left:
        shown = "; ".join(f"pid {pid}: {args[:120]}" for pid, args in left[:5])
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        holder.why_alive.append(
            f"it is gone, but {len(left)} process(es) it started still run ({shown}{more}): let them finish or "
            f"end them (`kill {' '.join(str(pid) for pid, _ in left)}`), and a rerun takes the lock over"
        )
    return holder


def stale_locks(lockdir: Path) -> tuple[list[Path], list[Holder], list[Holder], list[str]]:
    """(lock files provably stale, the gone holders that leave only those, the holders that may still run, lock
    files no record explains)."""
    locks = _lock_files(lockdir)
    holders = [h for p in sorted(lockdir.glob(f"{RECORD_PREFIX}*.json")) if (h := _judge(p)) is not None]
    stale, unexplained = [], []
    for name, identity in locks.items():
        listing = [h for h in holders if h.record.get("locks", {}).get(name) == identity]
        if not listing:
            unexplained.append(name)
        elif all(h.gone for h in listing):
            stale.append(lockdir / name)
    gone = [h for h in holders if h.gone]
    alive = [h for h in holders if not h.gone and any(n in locks for n in h.record.get("locks", {}))]
    return stale, gone, alive, unexplained


def locked_message(lockdir: Path, alive: list[Holder], unexplained: list[str]) -> str:
    lines = [f"{os.getcwd()}: the files of this run are locked by another Snakemake ({lockdir}):"]
    lines += [f"  - {h.describe()}: {'; '.join(h.why_alive)}" for h in alive]
    if unexplained:
        lines.append(
            f"  - {', '.join(unexplained)}: no record says which Snakemake took it (one started before this version "
            f"of the workflow kept none), so nothing tells whether it still runs"
        )
    lines.append(UNLOCK_WHEN)
    return "\n".join(lines)


def take_over_or_explain(lockdir: Path) -> str | None:
    """Where Snakemake found this run's files locked: remove the locks only dead local drivers left (saying so)
    and return None, or return the account of who may still hold them and when `snakemake --unlock` is safe."""
    stale, gone, alive, unexplained = stale_locks(lockdir)
    for path in stale:
        path.unlink(missing_ok=True)
    for holder in gone:
        if not any(n in _lock_files(lockdir) for n in holder.record.get("locks", {})):
            holder.path.unlink(missing_ok=True)
            print(
                f"removed the lock {holder.describe()} left in {lockdir}: it was killed before it could unlock, and "
                f"no process of it or its jobs runs on this machine",
                file=sys.stderr,
            )
    return locked_message(lockdir, alive, unexplained) if alive or unexplained else None


def dry_run_note(lockdir: Path) -> str:
    """What a dry run says of a lock on this run's files (it removes nothing and takes no lock): that a run will take
    over a lock only dead local drivers left, or who may still hold it and when `snakemake --unlock` is safe."""
    _, gone, alive, unexplained = stale_locks(lockdir)
    if alive or unexplained:
        account = locked_message(lockdir, alive, unexplained)
        return f"{account} (a run refuses to start until then; this dry run went on)"
    names = "; ".join(holder.describe() for holder in gone) or "a Snakemake that is gone"
    return (
        f"note: {lockdir} holds the lock of {names}, killed before it could unlock; nothing of it runs on this "
        f"machine, so the next run takes the lock over (this dry run changes nothing)"
    )


def _explained(snakemakes: type, message: str) -> type:
    """Snakemake's LockException (what its callers catch) with this workflow's account as its message."""
    from snakemake.exceptions import WorkflowError

    class LockException(snakemakes):
        def __init__(self):
            WorkflowError.__init__(self, message)

    return LockException


def record_workflow_driver(workflow: Any) -> Path | None:
    """record_driver for the workflow's onstart: its lock directory and executor, where Snakemake has them."""
    lockdir = getattr(getattr(workflow, "persistence", None), "_lockdir", None)
    executor = getattr(getattr(workflow, "executor_plugin", None), "name", "unknown")
    return record_driver(lockdir, executor) if lockdir else None


def install() -> None:
    """Where Snakemake takes its lock for a real run (never a dry run, nor --unlock): a lock on this run's files is
    first taken over when provably stale, or explained (take_over_or_explain); where a dry run only warns of it, the
    warning says which of the two a run will do (dry_run_note). Without the Snakemake internals this relies on,
    Snakemake's own check and message stay."""
    if (found := snakemake_patch.originals("snakemake.persistence", "PersistenceBase", "lock")) is None:
        return
    persistence, original = found

    @contextmanager
    def lock(self) -> Iterator[None]:
        from snakemake import exceptions

        lockdir = getattr(self, "_lockdir", None)
        message = take_over_or_explain(Path(lockdir)) if lockdir is not None and self.locked else None
        snakemakes = exceptions.LockException
        with ExitStack() as held:
            # Snakemake raises its LockException itself (with this account as the message, where there is one):
            # raised there, it is shown without a traceback of this module.
            exceptions.LockException = _explained(snakemakes, message) if message else snakemakes
            try:
                held.enter_context(original(self))
            finally:
                exceptions.LockException = snakemakes
            yield

    @contextmanager
    def lock_warn_only(self) -> Iterator[None]:
        lockdir = getattr(self, "_lockdir", None)
        if lockdir is not None and self.locked:
            print(dry_run_note(Path(lockdir)), file=sys.stderr)
        yield

    snakemake_patch.replace(persistence, lock=lock)
    # A dry run (Snakemake only warns there, as "Error: Directory cannot be locked. Another Snakemake instance is
    # running.", even when the holder is long dead): the same account, changing nothing.
    if hasattr(persistence, "lock_warn_only"):
        snakemake_patch.replace(persistence, lock_warn_only=lock_warn_only)
