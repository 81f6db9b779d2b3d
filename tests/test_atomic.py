import os
import stat

import pytest

from videogrpo import atomic


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_the_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic.write_text(tmp_path / "a.txt", "hello")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_atomic_directory_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "dir"
    with atomic.atomic_directory(target) as tmp:
        (tmp / "old").write_text("1")
    with pytest.raises(ValueError):
        with atomic.atomic_directory(target) as tmp:
            (tmp / "new").write_text("2")
            raise ValueError
    assert sorted(p.name for p in target.iterdir()) == ["old"]
    with atomic.atomic_directory(target) as tmp:
        (tmp / "new").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


def test_files_a_library_writes_private_get_the_usual_permissions(tmp_path):
    import os

    from videogrpo import atomic

    with atomic.atomic_directory(tmp_path / "out") as tmp:
        private = tmp / "model.safetensors"
        private.write_bytes(b"x")
        os.chmod(private, 0o600)  # what safetensors' writer leaves
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "out/model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask
