"""Pinned snapshots through huggingface_hub's own client against a loopback Hub (tests/hub_server.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from videogrpo.errors import ConfigError
from videogrpo.provenance.digest import tree_digest

from hub_server import HubServer, files_of

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "f" * 40


def run_snapshot(endpoint, repo_id, revision, out, repo_type="model", allow=None):
    """In a subprocess: huggingface_hub reads HF_ENDPOINT when it is imported."""
    code = (
        "import sys, json; from pathlib import Path; from videogrpo import hub; "
        "a = json.loads(sys.argv[1]); hub.snapshot(a[0], a[1], Path(a[2]), repo_type=a[3], allow_patterns=a[4])"
    )
    env = dict(
        os.environ,
        HF_ENDPOINT=endpoint,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_ETAG_TIMEOUT="5",
        HF_HOME=str(out.parent / "hf-home"),
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps([repo_id, revision, str(out), repo_type, allow])],
        env=env,
        capture_output=True,
        text=True,
    )


def test_snapshot_of_a_pinned_commit_is_byte_identical(tiny_model, tmp_path):
    with HubServer({("model", "org/tiny-wan"): {COMMIT: files_of(tiny_model)}}) as hub:
        result = run_snapshot(hub.endpoint, "org/tiny-wan", COMMIT, tmp_path / "model")
        assert result.returncode == 0, result.stderr
        assert any("/tree/" + COMMIT in r for r in hub.requests)
        assert any("/resolve/" + COMMIT + "/transformer/" in r for r in hub.requests)
    assert tree_digest(tmp_path / "model") == tree_digest(tiny_model)
    assert not (tmp_path / ".model.partial").exists()


def test_dataset_snapshot_takes_only_the_archives(archives, tmp_path):
    files = files_of(archives)
    files["README.md"] = b"# card\n"
    with HubServer({("dataset", "org/vbvr"): {COMMIT: files}}) as hub:
        result = run_snapshot(
            hub.endpoint, "org/vbvr", COMMIT, tmp_path / "data", "dataset", ["VBVR-Pro-RL-Video/*.tar.gz"]
        )
        assert result.returncode == 0, result.stderr
    got = sorted(p.relative_to(tmp_path / "data").as_posix() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert got == sorted(name for name in files if name.endswith(".tar.gz"))


def test_unknown_revision_is_a_clear_error(tiny_model, tmp_path):
    with HubServer({("model", "org/tiny-wan"): {COMMIT: files_of(tiny_model)}}) as hub:
        result = run_snapshot(hub.endpoint, "org/tiny-wan", OTHER, tmp_path / "model")
    assert result.returncode != 0
    assert f"model org/tiny-wan@{OTHER}: not found on the Hub" in result.stderr
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("revision", ["main", "v1.0", "0123abc"])
def test_branch_and_tag_names_are_refused_before_any_request(tmp_path, revision):
    from videogrpo import hub

    with pytest.raises(ConfigError, match="must be a 40-hex commit id"):
        hub.snapshot("org/x", revision, tmp_path / "m")


def test_fetch_model_stage_from_the_hub_writes_a_manifest(tiny_model, tmp_path):
    sections = {"model": {"source": "hub", "repo_id": "org/tiny-wan", "revision": COMMIT}}
    with HubServer({("model", "org/tiny-wan"): {COMMIT: files_of(tiny_model)}}) as hub:
        env = dict(os.environ, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf-home"))
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "videogrpo"),
                "fetch-model",
                "--config-json",
                json.dumps(sections),
                "--out",
                str(tmp_path / "model"),
                "--manifest",
                str(tmp_path / "m.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["summary"] == {"source": "hub", "repo_id": "org/tiny-wan", "revision": COMMIT}
    assert manifest["outputs"]["model"]["tree_sha256"] == tree_digest(tiny_model)


def test_large_files_come_through_lfs_redirects_and_are_checked_against_the_listing(archives, tmp_path):
    files = files_of(archives)
    name = next(n for n in files if n.endswith(".tar.gz"))
    with HubServer({("dataset", "org/vbvr"): {COMMIT: files}}, corrupt={name}) as hub:
        result = run_snapshot(hub.endpoint, "org/vbvr", COMMIT, tmp_path / "data", "dataset", ["VBVR-Pro-RL-Video/*"])
        assert any(r.startswith("GET /lfs-cdn/") for r in hub.requests)  # served from storage after a 302
    assert result.returncode != 0
    assert f"{name}: {len(files[name])} bytes" in result.stderr and "the Hub lists" in result.stderr
    assert "deleted; rerun to download them again" in result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / ".data.partial" / name).exists()
    with HubServer({("dataset", "org/vbvr"): {COMMIT: files}}) as hub:  # the storage serves the right bytes now
        result = run_snapshot(hub.endpoint, "org/vbvr", COMMIT, tmp_path / "data", "dataset", ["VBVR-Pro-RL-Video/*"])
        assert result.returncode == 0, result.stderr
        fetched = [r for r in hub.requests if r.startswith("GET /lfs-cdn/")]
    assert len(fetched) == 1, "only the deleted archive is downloaded again"
    assert (tmp_path / "data" / name).read_bytes() == files[name]
