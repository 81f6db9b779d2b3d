"""Hostile and corrupt archives: every one refused with the archive named, nothing from it kept, and the same
behaviour whichever inflater (ISA-L or zlib) reads the stream."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from videogrpo.data.materialize import materialize
from videogrpo.demo import synthetic_dataset
from videogrpo.errors import DataError
from videogrpo.provenance.digest import sha256_file

from conftest import FRAMES, SIDE, TASKS

TASK = TASKS[0]
INFLATERS = ("isal", "zlib")


def sample(index=0, task=TASK) -> dict[str, bytes]:
    return synthetic_dataset.sample_members(task, index, 0, FRAMES, SIDE, SIDE, 16)


def renamed(members: dict[str, bytes], sample_id: str) -> dict[str, bytes]:
    return {"/".join([*k.split("/")[:2], sample_id, *k.split("/")[3:]]): v for k, v in members.items()}


def write_archive(path: Path, members: dict[str, bytes], level: int = 6, fmt=tarfile.PAX_FORMAT, **tar_kw) -> Path:
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", compresslevel=level, fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=fmt, **tar_kw) as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def unpack(out: Path, archives: list[Path], tasks=(TASK,), per_task=1, **kw):
    return materialize(archives, out, list(tasks), per_task, 0, 42, "s", {"repo": "t"}, log=lambda _: None, **kw)


def kept_files(out: Path) -> list[Path]:
    return sorted(p for p in (out / "raw").rglob("*") if p.is_file()) if (out / "raw").exists() else []


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def refused(out: Path, archives: list[Path], match: str, **kw) -> str:
    with pytest.raises(DataError, match=match) as err:
        unpack(out, archives, **kw)
    assert str(archives[-1]) in str(err.value)
    assert not kept_files(out), "nothing of a refused archive may be kept"
    assert not (out / "dataset.json").exists()
    return str(err.value)


@pytest.mark.parametrize("inflater", INFLATERS)
def test_corruption_inside_a_stored_deflate_block_keeps_nothing(tmp_path, inflater):
    """The CRC is at the end of the stream: members before it were read but must not survive it."""
    archive = write_archive(tmp_path / "a.tar.gz", sample(), level=0)
    mp4 = sample()[next(k for k in sample() if k.endswith(".mp4"))]
    flip(archive, archive.read_bytes().index(mp4[100:140]) + 5)  # same size, one byte of the video changed
    refused(tmp_path / "out", [archive], r"corrupt archive: the gzip stream does not inflate", inflater=inflater)
    # After a fresh download, every file is written again: none of the corrupt ones is trusted.
    good = write_archive(tmp_path / "a.tar.gz", sample(), level=0)
    unpack(tmp_path / "out", [good], inflater=inflater)
    for name, data in sample().items():
        task, _, sample_id, *field = name.split("/")
        if field != ["video", "generation_info.json"]:
            assert (tmp_path / "out/raw" / task / sample_id / "/".join(field)).read_bytes() == data


@pytest.mark.parametrize("inflater", INFLATERS)
@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda p: flip(p, p.stat().st_size - 8), "does not inflate"),  # CRC-32 trailer
        (lambda p: flip(p, p.stat().st_size - 2), "does not inflate"),  # length trailer
        (lambda p: p.write_bytes(p.read_bytes() + b"trailing garbage"), "trailing bytes after the gzip stream"),
        (lambda p: p.write_bytes(p.read_bytes()[:-9]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "truncated"),
        (lambda p: p.write_bytes(b"PK\x03\x04" + p.read_bytes()), "not a gzip file"),
    ],
    ids=["crc", "isize", "trailing-garbage", "truncated-trailer", "truncated-half", "not-gzip"],
)
def test_damaged_gzip_streams_are_refused_naming_the_archive(tmp_path, inflater, damage, match):
    archive = write_archive(tmp_path / "a.tar.gz", sample())
    damage(archive)
    refused(tmp_path / "out", [archive], match, inflater=inflater)


@pytest.mark.parametrize("inflater", INFLATERS)
def test_a_corrupt_header_mid_archive_is_corruption_not_an_incomplete_sample(tmp_path, inflater):
    """A tar stream damaged before it was compressed: the gzip layer is intact, the third header is not."""
    members = sample()
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    damaged = bytearray(plain.getvalue())
    damaged[damaged.index(list(members)[2].encode()) + 3] ^= 0x5A
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(bytes(damaged)))
    message = refused(tmp_path / "out", [archive], r"corrupt archive: invalid tar header", inflater=inflater)
    assert "incomplete" not in message and repr(list(members)[1]) in message  # names the member before it


@pytest.mark.parametrize("inflater", INFLATERS)
def test_a_member_over_the_size_limit_fails_at_that_member(tmp_path, inflater):
    members = sample()
    archive = write_archive(tmp_path / "a.tar.gz", members)
    mp4 = next(k for k in members if k.endswith(".mp4"))
    refused(
        tmp_path / "out",
        [archive],
        rf"member '{mp4}' is {len(members[mp4])} bytes, over data.max_member_mb",
        inflater=inflater,
        max_member_bytes=len(members[mp4]) - 1,
    )


def test_a_bomb_is_refused_from_its_header_before_inflating(tmp_path):
    """512 MiB of zeros compress to 0.5 MB; the header's size is checked before a byte is written."""
    bomb = tmp_path / "bomb.tar.gz"
    subprocess.run(
        f"head -c 536870912 /dev/zero > {tmp_path}/big && tar -C {tmp_path} --transform 's|^big|{TASK}/d/0/video/"
        f"ground_truth.mp4|' -czf {bomb} big && rm {tmp_path}/big",
        shell=True,
        check=True,
    )
    assert bomb.stat().st_size < 1 << 20
    refused(tmp_path / "out", [bomb], r"ground_truth.mp4' is 536870912 bytes, over data.max_member_mb = 256 MiB")


@pytest.mark.parametrize("inflater", INFLATERS)
@pytest.mark.parametrize(
    "name,message",
    [
        ("/abs/x/y/first_frame.png", "absolute path"),
        (f"{TASK}/d/../../escape/first_frame.png", "'..'"),
        (f"{TASK}/./s/first_frame.png", "'.'"),
        (f"{TASK}/d/s\\x/first_frame.png", "backslash"),
    ],
)
def test_escaping_member_names_are_refused(tmp_path, inflater, name, message):
    archive = write_archive(tmp_path / "a.tar.gz", {**sample(), name: b"x"})
    refused(tmp_path / "out", [archive], message, inflater=inflater)
    assert not list(tmp_path.rglob("escape"))


@pytest.mark.parametrize("inflater", INFLATERS)
@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
def test_links_and_special_files_are_refused(tmp_path, inflater, kind):
    archive = tmp_path / "a.tar.gz"
    with gzip.open(archive, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        info = tarfile.TarInfo(f"{TASK}/d/s/first_frame.png")
        info.type, info.linkname = kind, "/etc/passwd"
        tar.addfile(info)
    refused(tmp_path / "out", [archive], "link or special file", inflater=inflater)


def test_a_non_utf8_sample_id_fails_at_the_member_before_any_index_is_written(tmp_path):
    name = f"{TASK}/d/s\udcff/first_frame.png"
    archive = write_archive(tmp_path / "a.tar.gz", {name: b"x"}, encoding="utf-8", errors="surrogateescape")
    refused(tmp_path / "out", [archive], r"is not valid UTF-8")


def test_long_names_in_pax_and_gnu_headers_unpack(tmp_path):
    long_id = "s" * 180
    members = renamed(sample(), long_id)
    for fmt, out in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
        archive = write_archive(tmp_path / f"{out}.tar.gz", members, fmt=fmt)
        record = unpack(tmp_path / out, [archive]).record
        assert record["counts"]["files_written"] == 5
        assert (tmp_path / out / "raw" / TASK / long_id / "video/prompt.txt").is_file()


def test_a_name_too_long_for_the_file_system_is_not_blamed_on_the_download(tmp_path):
    members = renamed(sample(), "s" * 300)
    archive = write_archive(tmp_path / "a.tar.gz", members)
    message = refused(tmp_path / "out", [archive], "too long for the file system")
    assert "download" not in message


def test_a_full_disk_names_the_file_and_keeps_nothing(small_disk):
    members = {k: (os.urandom(400_000) if k.endswith(".mp4") else v) for k, v in sample().items()}
    archive = write_archive(small_disk.parent / "a.tar.gz", members)
    message = refused(small_disk / "out", [archive], r"no space left on device writing .*ground_truth.mp4")
    assert "download" not in message and "member" in message


def test_an_archive_that_differs_from_the_fetch_record_is_refused(tmp_path):
    archive = write_archive(tmp_path / "a.tar.gz", sample())
    wrong = {archive.name: ("0" * 64, archive.stat().st_size)}
    message = refused(
        tmp_path / "out", [archive], "differs from 0{64} recorded by fetch", expected=wrong, expected_from="fetch (m)"
    )
    assert sha256_file(archive) in message
    right = {archive.name: (sha256_file(archive), archive.stat().st_size)}
    record = unpack(tmp_path / "out", [archive], expected=right, expected_from="fetch (m)").record
    assert record["archives_verified_against"] == "fetch (m)"


def test_a_failed_rerun_leaves_no_index_of_the_previous_run(tmp_path):
    archive = write_archive(tmp_path / "a.tar.gz", sample())
    unpack(tmp_path / "out", [archive])
    assert (tmp_path / "out/dataset.json").exists()
    archive.write_bytes(archive.read_bytes()[:-9])
    with pytest.raises(DataError, match="truncated"):
        unpack(tmp_path / "out", [archive])
    assert not any((tmp_path / "out" / n).exists() for n in ("dataset.json", "splits.json", "materialization.json"))


@pytest.mark.parametrize("inflater", INFLATERS)
def test_single_byte_flips_are_harmless_or_refused_never_a_crash(tmp_path, inflater):
    """60 positions across a valid archive: the files come out byte-identical, or DataError names the archive."""
    members = sample()
    archive = write_archive(tmp_path / "a.tar.gz", members)
    baseline = unpack(tmp_path / "baseline", [archive], inflater=inflater).raw_entries
    data = archive.read_bytes()
    positions = sorted({round(i * (len(data) - 1) / 59) for i in range(60)} | {0, 3, 4, 9, len(data) - 1})
    outcomes = {"harmless": 0, "refused": 0}
    for n, offset in enumerate(positions):
        damaged = tmp_path / f"flip{n}.tar.gz"
        damaged.write_bytes(data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :])
        out = tmp_path / f"out{n}"
        try:
            result = unpack(out, [damaged], inflater=inflater)
        except DataError as err:
            assert str(damaged) in str(err), (offset, str(err))
            assert not kept_files(out), offset
            outcomes["refused"] += 1
            continue
        assert result.raw_entries == baseline, offset
        outcomes["harmless"] += 1
    assert outcomes["refused"] >= 50 and outcomes["harmless"] >= 1, outcomes  # the gzip header's MTIME/OS bytes


def test_resume_trusts_a_kept_file_only_through_its_archive_record(tmp_path):
    members = sample()
    archive = write_archive(tmp_path / "a.tar.gz", members)
    out = tmp_path / "out"
    first = unpack(out, [archive]).record["counts"]
    assert (first["files_written"], first["archives_unpacked"]) == (5, 1)
    again = unpack(out, [archive]).record["counts"]
    assert (again["files_written"], again["files_kept"], again["archives_kept"]) == (0, 5, 1)
    sample_id = next(iter(members)).split("/")[2]
    prompt = out / "raw" / TASK / sample_id / "video/prompt.txt"
    original = prompt.read_bytes()
    # A same-size rewrite changes the mtime: the file is hashed, found changed, and repaired by name.
    prompt.write_bytes(b"X" * len(original))
    logs: list[str] = []
    repaired = materialize([archive], out, [TASK], 1, 0, 42, "s", {"repo": "t"}, log=logs.append)
    assert repaired.repaired == [f"{TASK}/{sample_id}/video/prompt.txt"] and prompt.read_bytes() == original
    assert any(f"repairing raw/{TASK}/{sample_id}/video/prompt.txt" in line for line in logs)
    assert repaired.record["counts"]["files_written"] == 1 and repaired.record["counts"]["files_kept"] == 4
    # Corruption that puts the mtime back still moves the change time (the kernel's): hashed and repaired.
    st = prompt.stat()
    prompt.write_bytes(b"Y" * len(original))
    os.utime(prompt, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert unpack(out, [archive]).repaired == [f"{TASK}/{sample_id}/video/prompt.txt"]
    assert prompt.read_bytes() == original
    # A record whose stamps match a changed file (a file system without reliable change times) passes the cheap
    # check; verify_existing hashes every kept file.
    prompt.write_bytes(b"Y" * len(original))
    (record_file,) = (out / ".unpacked").glob("*.json")
    record = json.loads(record_file.read_text())
    record["files"][f"{TASK}/{sample_id}/video/prompt.txt"][2:] = [prompt.stat().st_mtime_ns, prompt.stat().st_ctime_ns]
    record_file.write_text(json.dumps(record))
    assert unpack(out, [archive]).repaired == []
    assert unpack(out, [archive], verify_existing=True).repaired == [f"{TASK}/{sample_id}/video/prompt.txt"]
    assert prompt.read_bytes() == original
    # A file with no record (left by an interrupted run) is never trusted, whatever its size.
    for record in (out / ".unpacked").glob("*.json"):
        record.unlink()
    prompt.write_bytes(b"Z" * len(original))
    assert unpack(out, [archive]).record["counts"]["files_written"] == 5 and prompt.read_bytes() == original


def test_parallel_workers_unpack_the_same_tree(tmp_path):
    archives = [
        write_archive(tmp_path / f"{i}.tar.gz", {**sample(0, task), **sample(1, task)}) for i, task in enumerate(TASKS)
    ]
    one = unpack(tmp_path / "one", archives, tasks=TASKS, per_task=2, workers=1)
    two = unpack(tmp_path / "two", archives, tasks=TASKS, per_task=2, workers=2)
    assert one.raw_entries == two.raw_entries and len(one.raw_entries) == 30
    assert (tmp_path / "one/splits.json").read_text() == (tmp_path / "two/splits.json").read_text()
    # A bad archive among good ones fails the run, names it, and keeps the good archives' work for the rerun.
    flip(archives[1], archives[1].stat().st_size - 8)
    with pytest.raises(DataError, match=str(archives[1])):
        unpack(tmp_path / "three", archives, tasks=TASKS, per_task=2, workers=2)
    assert not (tmp_path / "three/raw" / TASKS[1]).exists()


def test_a_kept_archive_is_checked_again_when_its_file_changed(tmp_path):
    archive = write_archive(tmp_path / "a.tar.gz", sample())
    fetched = {archive.name: (sha256_file(archive), archive.stat().st_size)}
    unpack(tmp_path / "out", [archive], expected=fetched, expected_from="fetch (m)")
    flip(archive, 4)  # the gzip header's MTIME: still a valid archive, but not the bytes the fetch recorded
    refused_again = pytest.raises(DataError, match=r"a.tar.gz: SHA-256 .* differs from .* recorded by fetch \(m\)")
    with refused_again:
        unpack(tmp_path / "out", [archive], expected=fetched, expected_from="fetch (m)")
    write_archive(archive, sample())  # downloaded again: same bytes, new mtime; hashed once, then kept
    again = unpack(tmp_path / "out", [archive], expected=fetched, expected_from="fetch (m)").record["counts"]
    assert again["archives_kept"] == 1
