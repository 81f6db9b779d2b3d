import hashlib
import struct
from pathlib import Path

import pytest

from videogrpo.errors import VideoGRPOError
from videogrpo.provenance import digest


def independent_evalkit_digest(root: Path, files: list[str]) -> str:
    """docs/reference-system.md#rule-reward, written out again without the package's helpers."""
    h = hashlib.sha256()
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(len(rel.encode()).to_bytes(4, "big") + rel.encode())
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def make_kit(root: Path) -> None:
    for rel, text in {
        "run_evaluation.py": "print('x')\n",
        "vbvr_bench/a-b/c.py": "1\n",
        "vbvr_bench/a/b.py": "2\n",
        "vbvr_bench/a/notes.txt": "not python\n",
        "vbvr_bench/z.py": "3\n",
        "annotations/b/x.json": "{}\n",
        "annotations/a.json": "[]\n",
        "requirements.txt": "numpy\n",
        "README.md": "not covered\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_evalkit_files_sort_by_path_components_and_skip_non_python(tmp_path):
    make_kit(tmp_path)
    assert digest.evalkit_files(tmp_path) == [
        "run_evaluation.py",
        "vbvr_bench/a/b.py",
        "vbvr_bench/a-b/c.py",
        "vbvr_bench/z.py",
        "annotations/a.json",
        "annotations/b/x.json",
        "requirements.txt",
    ]


def test_tree_order_is_pathlib_order_for_any_names(tmp_path):
    """list_files orders by path components as pathlib compares them, whatever characters sort near "/"."""
    import random
    from pathlib import PurePosixPath

    rng = random.Random(0)
    alphabet = ["a", "b", "-", ".x", " ", "\x01", "0", "~", "é", "_"]
    names = set()
    while len(names) < 60:
        names.add("/".join("".join(rng.choices(alphabet, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 3))))
    names = {n for n in names if not any(n.startswith(o + "/") for o in names)}  # a file is no directory
    for rel in names:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert len(names) > 30
    assert digest.list_files(tmp_path) == sorted(names, key=lambda rel: PurePosixPath(rel).parts)


def test_evalkit_digest_matches_an_independent_implementation(tmp_path):
    make_kit(tmp_path)
    files = digest.evalkit_files(tmp_path)
    assert digest.evalkit_source_digest(tmp_path) == independent_evalkit_digest(tmp_path, files)


def test_evalkit_digest_without_annotations_or_requirements(tmp_path):
    (tmp_path / "run_evaluation.py").write_text("x = 1\n")
    assert digest.evalkit_files(tmp_path) == ["run_evaluation.py"]
    assert digest.evalkit_source_digest(tmp_path) == independent_evalkit_digest(tmp_path, ["run_evaluation.py"])


def test_evalkit_digest_needs_run_evaluation(tmp_path):
    (tmp_path / "vbvr_bench").mkdir()
    with pytest.raises(VideoGRPOError, match="run_evaluation.py"):
        digest.evalkit_source_digest(tmp_path)


def test_any_byte_changes_the_evalkit_digest(tmp_path):
    make_kit(tmp_path)
    before = digest.evalkit_source_digest(tmp_path)
    (tmp_path / "annotations/a.json").write_text("[ ]\n")
    assert digest.evalkit_source_digest(tmp_path) != before


def test_tree_digest_covers_paths_sizes_and_contents(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/f.bin").write_bytes(b"abc")
    (tmp_path / "g").write_bytes(b"")
    h = hashlib.sha256()
    for rel, data in (("d/f.bin", b"abc"), ("g", b"")):
        h.update(struct.pack(">I", len(rel)) + rel.encode() + struct.pack(">Q", len(data)))
        h.update(hashlib.sha256(data).digest())
    assert digest.tree_digest(tmp_path) == h.hexdigest()
    (tmp_path / "g").rename(tmp_path / "h")
    assert digest.tree_digest(tmp_path) != h.hexdigest()


def test_tree_ignores_partial_writes_and_snakemake_timestamp(tmp_path):
    (tmp_path / "f").write_text("x")
    before = digest.tree_digest(tmp_path)
    (tmp_path / ".f.abc.tmp").write_text("half")
    (tmp_path / ".snakemake_timestamp").write_text("")
    assert digest.list_files(tmp_path) == ["f"]
    assert digest.tree_digest(tmp_path) == before


def test_reference_evalkit_digest_is_the_one_pinned_in_the_default_config(repo):
    import yaml

    pinned = yaml.safe_load((repo / "config/config.yaml").read_text())["evalkit"]["digest"]
    assert digest.evalkit_source_digest(repo / "src/videogrpo/demo/stand_in_evalkit") == pinned


def test_code_digest_ignores_comments_docstrings_and_layout(tmp_path):
    from videogrpo.provenance.digest import code_digest

    variants = {
        "a.py": '"""Module."""\n\n\ndef f(x):\n    """Doc."""\n    return x + 1  # why\n',
        "b.py": "def f(x):\n\n    return (x\n            + 1)\n",
        "c.py": "def f(x):\n    return x + 2\n",
        "d.py": "def f(y):\n    return y + 1\n",
    }
    for name, text in variants.items():
        (tmp_path / name).write_text(text)
    digests = {name: code_digest(tmp_path / name) for name in variants}
    assert digests["a.py"] == digests["b.py"]
    assert len({digests["a.py"], digests["c.py"], digests["d.py"]}) == 3  # a constant or a name is code


def test_tree_entries_are_the_same_with_threads_processes_or_one_thread(tmp_path):
    from videogrpo.provenance import digest

    for i in range(2100):  # above the size where forked processes take over from threads
        sub = tmp_path / f"d{i % 7}" / ("video" if i % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}.bin").write_bytes(bytes([i % 251]) * (i % 97))
    (tmp_path / "big.bin").write_bytes(b"x" * (5 << 20))  # read in pieces, not whole
    one = digest.tree_entries(tmp_path, threads=1)
    assert len(one) == 2101 and one == digest.tree_entries(tmp_path, threads=2)
    assert one["big.bin"] == (hashlib.sha256(b"x" * (5 << 20)).hexdigest(), 5 << 20)
    assert list(one) == sorted(one, key=lambda rel: Path(rel).parts)
