"""Safe, streaming, resumable, parallel unpacking of the VBVR-Pro-RL archives (docs/reference-system.md#data).

Never calls a tar library's extract: members are streamed (`data/archive.py`), their names checked (no
absolute paths, no `.` or `..` components, no links or devices, UTF-8 only) and their sizes limited.
A member's bytes go to a temporary name beside its target and are hashed on the way; only once the
whole archive has been read to the end of its gzip stream, and its SHA-256 matches the one the fetch
recorded, are its files renamed into place and the archive's record (every file's SHA-256, size,
mtime and change time) written to `.unpacked/`. A corrupt archive therefore leaves nothing behind, and
a resume trusts a kept file only through that record: unchanged size, mtime and change time, or else a
SHA-256 that still matches. The kernel sets the change time on every write, so a file overwritten in
place with its size and mtime put back is hashed, and repaired. Archives are unpacked in parallel
processes; every byte is read and hashed once.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from videogrpo import atomic
from videogrpo.data.archive import ArchiveStream
from videogrpo.errors import DataError, disk_full_message
from videogrpo.progress import Progress
from videogrpo.provenance import digest

FIELDS = ("first_frame.png", "metadata.json", "video/final_frame.png", "video/ground_truth.mp4", "video/prompt.txt")
INDEX_FILES = ("dataset.json", "splits.json", "materialization.json")
RECORDS = ".unpacked"  # one record per completed archive, beside raw/ (not part of the tree)
_IN_PROGRESS = "IN_PROGRESS"


def member_parts(name: str, archive: Path) -> tuple[str, ...]:
    """Components of a member name, refusing anything that could escape the output directory."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"{archive}: member {name.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8; sample ids and "
            f"task names must be UTF-8 text (fix the archive)"
        ) from None
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise DataError(f"{archive}: member {name!r} has an absolute path; refusing to unpack this archive")
    parts = tuple(part for part in name.split("/") if part)  # "a//b" and a trailing "/" name the same path
    if "." in parts or ".." in parts or "\\" in name or "\0" in name:
        raise DataError(f"{archive}: member {name!r} has a '.', '..' or backslash component; refusing to unpack")
    return parts


@dataclass(frozen=True)
class ArchiveJob:
    """What one worker process unpacks, and what it may skip."""

    archive: str
    raw_dir: str
    tasks: frozenset[str]
    max_member_bytes: int
    inflater: str = "auto"
    expected_sha256: str | None = None
    expected_from: str = ""
    trusted: frozenset[str] = frozenset()
    """Files of this archive already in place and verified against its record: not written again."""


def _unpack_error(err: OSError, job: ArchiveJob, member: str, target: str | None) -> DataError:
    """An OS error while writing, named for what it is (never blamed on the archive)."""
    where = f"{job.archive}: member {member!r}"
    if target is not None and err.filename is None:
        err.filename = str(target)
    if full := disk_full_message(err):
        return DataError(f"{where}: {full}")
    if err.errno == errno.ENAMETOOLONG:
        return DataError(f"{where}: the name is too long for the file system under {job.raw_dir} ({err.strerror})")
    return DataError(f"{where}: cannot write {target or job.raw_dir} ({err}); check the output directory")


def unpack_archive(job: ArchiveJob, on_read: Callable[[int], None] | None = None) -> dict:
    """Stream one archive into temporary files, verify it end to end, then rename them into place.

    Returns the archive's record: {"archive", "sha256", "size", "ignored", "files": {rel: [sha, size,
    mtime_ns, ctime_ns]}} for the files written, and "trusted" for those skipped.
    """
    archive, raw = Path(job.archive), job.raw_dir
    files: dict[str, list] = {}
    temporaries: list[tuple[str, str]] = []
    made_dirs: set[str] = set()
    seen: set[str] = set()
    ignored = 0
    member, target = "(none)", None
    try:
        with ArchiveStream(archive, job.inflater, on_read) as stream:
            for info in stream.members():
                member, target = info.name, None
                parts = member_parts(info.name, archive)
                if info.kind == "dir":
                    continue
                if info.kind != "file":
                    raise DataError(f"{archive}: member {info.name!r} is a link or special file; refusing to unpack")
                if info.size > job.max_member_bytes:
                    raise DataError(
                        f"{archive}: member {info.name!r} is {info.size} bytes, over data.max_member_mb = "
                        f"{job.max_member_bytes / 2**20:g} MiB; refusing to unpack it (raise the limit if it is real)"
                    )
                field_name = "/".join(parts[3:])
                if len(parts) < 4 or field_name not in FIELDS:
                    ignored += 1
                    continue
                task, sample_id = parts[0], parts[2]
                if task not in job.tasks:
                    raise DataError(
                        f"{archive}: member {info.name!r} belongs to task {task!r}, which is not in "
                        f"data.task_list; add it there or fix the archive"
                    )
                rel = f"{task}/{sample_id}/{field_name}"
                if rel in seen:
                    raise DataError(f"{archive}: {rel} appears twice in this archive; each field must appear once")
                seen.add(rel)
                if rel in job.trusted:
                    continue
                target = f"{raw}/{rel}"
                parent, _, base = target.rpartition("/")
                if parent not in made_dirs:
                    os.makedirs(parent, exist_ok=True)
                    made_dirs.add(parent)
                tmp = f"{parent}/.{base}.{os.getpid()}.tmp"
                temporaries.append((tmp, target, rel))
                sha = hashlib.sha256()
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
                try:
                    for piece in stream.data(info):
                        sha.update(piece)
                        while piece:
                            piece = piece[os.write(fd, piece) :]
                    files[rel] = [sha.hexdigest(), info.size, os.fstat(fd).st_mtime_ns]
                finally:
                    os.close(fd)
            member, target = "(end of archive)", None
            sha256 = stream.finish()
        if job.expected_sha256 and sha256 != job.expected_sha256:
            raise DataError(
                f"{archive}: SHA-256 {sha256} differs from {job.expected_sha256} recorded by {job.expected_from}; "
                f"the file changed after it was fetched: rerun fetch_dataset (snakemake --forcerun fetch_dataset)"
            )
        for tmp, final, rel in temporaries:
            os.replace(tmp, final)
            files[rel].append(os.stat(final).st_ctime_ns)  # the rename sets it: the stamp a resume compares
        temporaries.clear()
    except OSError as err:
        raise _unpack_error(err, job, member, target) from None
    finally:
        for tmp, _, _ in temporaries:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    return {
        "archive": archive.name,
        "sha256": sha256,
        "size": stream.compressed_bytes,
        "mtime_ns": os.stat(archive).st_mtime_ns,
        "ignored": ignored,
        "files": files,
        "trusted": sorted(job.trusted),
    }


@dataclass
class Materialized:
    """What materialize() made: the materialization record and digests the manifest reuses."""

    record: dict
    raw_entries: dict[str, tuple[str, int]]
    archive_entries: dict[str, tuple[str, int]]
    repaired: list[str] = field(default_factory=list)


def _check_kept(raw: Path, files: dict[str, list], verify_existing: bool, threads: int) -> tuple[set[str], list[str]]:
    """Files of a completed archive that are still what its record says: (trusted, to repair).

    A file whose size, mtime and change time are as recorded is trusted (unless verify_existing); any
    other is hashed, and trusted only when its SHA-256 still matches (a record without a change time is
    hashed once, then stamped).
    """
    trusted, suspect, repair = set(), [], []
    for rel, (_, size, *stamp) in files.items():
        try:
            st = os.stat(raw / rel)
        except FileNotFoundError:
            repair.append(rel)
            continue
        if st.st_size != size:
            repair.append(rel)
        elif not verify_existing and stamp == [st.st_mtime_ns, st.st_ctime_ns]:
            trusted.add(rel)
        else:
            suspect.append(rel)
    for rel, (found, _) in digest.tree_entries(raw, suspect, threads=max(1, threads)).items():
        if found == files[rel][0]:
            trusted.add(rel)
            st = os.stat(raw / rel)
            files[rel][2:] = [st.st_mtime_ns, st.st_ctime_ns]
        else:
            repair.append(rel)
    return trusted, sorted(repair)


def _sweep_temporaries(raw: Path) -> None:
    """Remove temporary files an interrupted run left beside their targets."""
    stack = [str(raw)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    os.unlink(entry.path)


def check_counts(
    fields_of: dict[tuple[str, str], dict[str, str]], expected_tasks: list[str], samples_per_task: int
) -> dict[str, list[str]]:
    """Every sample complete, every task present with the expected count; returns task -> sample ids."""
    by_task: dict[str, list[str]] = defaultdict(list)
    incomplete = []
    for (task, sample_id), fields in sorted(fields_of.items()):
        missing = [f for f in FIELDS if f not in fields]
        if missing:
            archives = ", ".join(sorted(set(fields.values())))
            incomplete.append(f"{task}/{sample_id} lacks {', '.join(missing)} (in {archives})")
        by_task[task].append(sample_id)
    if incomplete:
        shown = "\n  ".join(incomplete[:10])
        raise DataError(f"{len(incomplete)} incomplete samples:\n  {shown}")
    missing_tasks = [t for t in expected_tasks if t not in by_task]
    if missing_tasks:
        raise DataError(f"tasks listed in data.task_list but absent from the archives: {missing_tasks}")
    wrong = {t: len(ids) for t, ids in by_task.items() if len(ids) != samples_per_task}
    if wrong:
        raise DataError(f"sample counts differ from data.samples_per_task = {samples_per_task}: {wrong}")
    return {task: sorted(by_task[task]) for task in expected_tasks}


def split(samples: dict[str, list[str]], heldout_per_task: int, seed: int) -> dict[str, dict[str, list[str]]]:
    """Hold out `heldout_per_task` ids per task, chosen by a seeded permutation; the rest are for RL."""
    import numpy as np  # here only: the unpack workers never need it

    result = {}
    for index, (task, ids) in enumerate(sorted(samples.items())):
        order = np.random.default_rng([seed, index]).permutation(len(ids))
        heldout = sorted(ids[i] for i in order[:heldout_per_task])
        held = set(heldout)  # once per task: a set per sample made this quadratic in the task's samples
        result[task] = {"rl": [i for i in ids if i not in held], "heldout": heldout}
    return result


_read_counter = None  # compressed bytes read by every worker, shared with the parent for its progress line


def _init_worker(counter) -> None:
    global _read_counter
    _read_counter = counter


def _count_read(n: int) -> None:
    with _read_counter.get_lock():
        _read_counter.value += n


def _unpack_in_worker(job: ArchiveJob) -> dict:
    return unpack_archive(job, on_read=_count_read)


def _run_jobs(jobs: list[ArchiveJob], workers: int, done: Callable[[dict], None], log: Callable[[str], None]) -> None:
    """Unpack every job, `workers` archives at a time, handing each record to `done` as soon as it is complete
    (so an interrupted run keeps every finished archive), with one progress line for all of them."""
    total = sum(Path(j.archive).stat().st_size for j in jobs)
    progress = Progress(f"unpack {len(jobs)} archives", total=total, unit="B")

    def finished(record: dict) -> None:
        done(record)
        progress.update(0, files=len(record["files"]))
        log(f"unpacked {record['archive']}: {len(record['files'])} files written, {record['ignored']} members ignored")

    if workers <= 1 or len(jobs) == 1:
        for job in jobs:
            finished(unpack_archive(job, on_read=progress.update))
        progress.finish()
        return
    counter = multiprocessing.Value("q", 0)
    with ProcessPoolExecutor(
        max_workers=min(workers, len(jobs)), initializer=_init_worker, initargs=(counter,)
    ) as pool:
        pending = {pool.submit(_unpack_in_worker, job) for job in jobs}
        try:
            while pending:
                complete, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in complete:
                    finished(future.result())
                progress.set(counter.value, progress.files)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    progress.finish()


def materialize(
    archives: list[Path],
    out_dir: Path,
    tasks: list[str],
    samples_per_task: int,
    heldout_per_task: int,
    seed: int,
    split_name: str,
    source: dict,
    verify_existing: bool = False,
    expected: dict[str, tuple[str, int]] | None = None,
    expected_from: str = "",
    workers: int = 1,
    max_member_bytes: int = 256 << 20,
    inflater: str = "auto",
    log: Callable[[str], None] = print,
) -> Materialized:
    """Unpack `archives` into out_dir/raw and write dataset.json, splits.json, materialization.json.

    `expected` maps archive names to the (sha256, size) the fetch recorded; an archive that differs is
    refused before any of its files is kept.
    """
    if not archives:
        raise DataError(f"no archives to unpack for {source}; check data.archive_glob")
    for name in INDEX_FILES:  # a failed run must not leave the previous run's index looking current
        (out_dir / name).unlink(missing_ok=True)
    raw, records_dir = out_dir / "raw", out_dir / RECORDS
    raw.mkdir(parents=True, exist_ok=True)
    records_dir.mkdir(parents=True, exist_ok=True)
    if (records_dir / _IN_PROGRESS).exists():
        _sweep_temporaries(raw)
    atomic.write_text(records_dir / _IN_PROGRESS, "an unpack is running or was interrupted\n")
    if expected is not None:
        unknown = sorted({a.name for a in archives} - set(expected))
        if unknown:
            raise DataError(f"archives {unknown} are not in {expected_from}; rerun fetch_dataset")
    records: dict[str, dict] = {}
    previous: dict[str, dict] = {}
    jobs, repaired, kept = [], [], 0
    for archive in archives:
        want = expected.get(archive.name, (None, None))[0] if expected is not None else None
        record = _read_record(records_dir / f"{archive.name}.json", archive, want)
        trusted: set[str] = set()
        if record is not None:
            before = json.dumps(record, sort_keys=True)
            trusted, repair = _check_kept(raw, record["files"], verify_existing, workers)
            for rel in repair:
                log(f"repairing raw/{rel}: not what {archive.name} holds (recorded SHA-256 {record['files'][rel][0]})")
            repaired += repair
            if not repair:
                if json.dumps(record, sort_keys=True) != before:  # stamps refreshed after a hash check
                    atomic.write_json(records_dir / f"{archive.name}.json", record, compact=True)
                records[archive.name] = record
                kept += len(record["files"])
                continue
            previous[archive.name] = record
        jobs.append(
            ArchiveJob(
                str(archive),
                str(raw),
                frozenset(tasks),
                max_member_bytes,
                inflater,
                want,
                expected_from,
                frozenset(trusted),
            )
        )
    kept_archives = len(records)
    tally = {"written": 0, "bytes": 0, "kept": kept}

    def record_archive(result: dict) -> None:
        old = previous.get(result["archive"], {"files": {}})["files"]
        files = {rel: old[rel] for rel in result.pop("trusted")}
        tally["kept"] += len(files)
        tally["written"] += len(result["files"])
        tally["bytes"] += sum(entry[1] for entry in result["files"].values())
        result["files"] = dict(sorted({**files, **result["files"]}.items()))
        atomic.write_json(records_dir / f"{result['archive']}.json", result, compact=True)
        records[result["archive"]] = result

    if jobs:
        _run_jobs(jobs, workers, record_archive, log)
    written, bytes_written, kept = tally["written"], tally["bytes"], tally["kept"]
    fields_of: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    wanted = set(tasks)
    for name in sorted(records):
        for rel in records[name]["files"]:
            task, sample_id, field_name = rel.split("/", 2)
            if task not in wanted:  # a record kept from a run with another task list
                raise DataError(
                    f"{name}: {rel} belongs to task {task!r}, which is not in data.task_list; add it there or "
                    f"fix the archive"
                )
            fields = fields_of[(task, sample_id)]
            if field_name in fields:
                raise DataError(
                    f"{name}: {task}/{sample_id}/{field_name} appears twice (also in {fields[field_name]}); "
                    f"each sample field must appear once"
                )
            fields[field_name] = name
    samples = check_counts(fields_of, tasks, samples_per_task)
    splits = split(samples, heldout_per_task, seed)
    raw_entries = _raw_entries(raw, records, workers, log)
    split_manifest = [
        {
            "task": task,
            "source": fields_of[(task, (ids["rl"] or ids["heldout"])[0])]["metadata.json"],
            "split": split_name,
            "rl": ids["rl"],
            "heldout": ids["heldout"],
        }
        for task, ids in splits.items()
    ]
    counts = {
        "tasks": len(samples),
        "samples": sum(len(v) for v in samples.values()),
        "archives_unpacked": len(jobs),
        "archives_kept": kept_archives,
        "files_written": written,
        "files_kept": kept,
        "files_repaired": len(repaired),
        "members_ignored": sum(r["ignored"] for r in records.values()),
        "bytes_written": bytes_written,
    }
    archive_entries = {a.name: (records[a.name]["sha256"], records[a.name]["size"]) for a in archives}
    materialization = dict(
        source,
        archives=[{"name": n, "size": size, "sha256": sha} for n, (sha, size) in archive_entries.items()],
        archive_bytes=sum(size for _, size in archive_entries.values()),
        archives_verified_against=expected_from or None,
        raw_tree_sha256=digest.tree_digest_of_entries(raw_entries),
        counts=counts,
    )
    atomic.write_json(out_dir / "dataset.json", {"root": "raw", "fields": list(FIELDS), "tasks": samples})
    atomic.write_json(out_dir / "splits.json", split_manifest)
    atomic.write_json(out_dir / "materialization.json", materialization)
    (records_dir / _IN_PROGRESS).unlink()
    log(
        f"materialized {counts['samples']} samples of {counts['tasks']} tasks into {raw} ({len(jobs)} archives "
        f"unpacked, {kept_archives} kept; {written} files written, {kept} kept, {len(repaired)} repaired, "
        f"{counts['members_ignored']} members ignored)"
    )
    return Materialized(materialization, raw_entries, archive_entries, repaired)


def _read_record(path: Path, archive: Path | None, expected_sha256: str | None) -> dict | None:
    """The record of a completed unpack of `archive`, if there is one and it is of these archive bytes."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if archive is None:
        return record
    st = archive.stat()
    unchanged = (record.get("size"), record.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)
    if expected_sha256 is None:  # no fetch record to compare with: only the same file, untouched since
        return record if unchanged else None
    if record.get("sha256") != expected_sha256:
        return None
    if not unchanged:  # fetched again, or touched: the file itself must still be what the fetch recorded
        if digest.sha256_file(archive) != expected_sha256:
            return None  # unpacked again, which fails naming both digests
        record["mtime_ns"] = st.st_mtime_ns
    return record


def _raw_entries(raw: Path, records: dict[str, dict], threads: int, log: Callable[[str], None]) -> dict:
    """(sha256, size) of every file under raw/, from the records where they vouch for it, hashed otherwise."""
    known = {rel: (sha, size) for r in records.values() for rel, (sha, size, *_) in r["files"].items()}
    entries = digest.tree_entries(raw, threads=threads, known=known)
    strays = [rel for rel in entries if rel not in known]
    if strays:
        log(f"note: {len(strays)} files under {raw} come from no archive (e.g. {strays[0]}); kept, and recorded")
    missing = sorted(set(known) - set(entries))
    if missing:
        raise DataError(f"{raw}: {len(missing)} unpacked files vanished during the run (e.g. {missing[0]})")
    return entries
