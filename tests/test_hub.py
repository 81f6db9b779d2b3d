"""Pinned snapshots through huggingface_hub's own client against a loopback Hub (tests/hub_server.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from videogrpo.errors import ConfigError
from videogrpo.provenance.digest import tree_digest

from hub_server import HubServer, files_of

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "f" * 40


def run_snapshot(endpoint, repo_id, revision, out, repo_type="model", allow=None):
    """In a subprocess: huggingface_hub reads HF_ENDPOINT when it is imported."""
    code = (
        "import sys, json; from pathlib import Path; from videogrpo.artifacts import hub; "
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
    from videogrpo.artifacts import hub

    with pytest.raises(ConfigError, match="must be a lower-case 40-hex commit id"):
        hub.snapshot("org/x", revision, tmp_path / "m")


def test_fetch_model_stage_from_the_hub_writes_a_manifest(tiny_model, tmp_path):
    sections = {"model": {"source": "hub", "repo_id": "org/tiny-wan", "revision": COMMIT}}
    with HubServer({("model", "org/tiny-wan"): {COMMIT: files_of(tiny_model)}}) as hub:
        env = dict(os.environ, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf-home"))
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "videogrpo"),
                "stage",
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


def fetch_model_stage(endpoint, tmp_path, token=None, out="model"):
    """`videogrpo fetch-model` from the loopback Hub, as the workflow runs it ($HF_TOKEN in the environment)."""
    sections = {"model": {"source": "hub", "repo_id": "org/tiny-wan", "revision": COMMIT}}
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    command = [str(Path(sys.executable).parent / "videogrpo"), "stage", "fetch-model"]
    command += ["--config-json", json.dumps(sections)]
    command += ["--out", str(tmp_path / out), "--manifest", str(tmp_path / f"{out}.manifest.json")]
    return subprocess.run(command, env=env, capture_output=True, text=True)


def partial_dir(tmp_path, out="model"):
    return tmp_path / f".{out}.partial"


def test_a_partial_file_at_its_listed_size_is_hashed_and_promoted_without_a_ranged_request(tiny_model, tmp_path):
    """A run killed after a file's last byte, before its rename: the Hub answers 416 to a range at the end."""
    files = files_of(tiny_model)
    whole = ["transformer/diffusion_pytorch_model.safetensors", "model_index.json"]  # an LFS and a git file
    wrong = "vae/diffusion_pytorch_model.safetensors"  # at its listed size, but not the listed bytes
    for name in [*whole, wrong]:
        part = partial_dir(tmp_path) / f"{name}.incomplete"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(files[name] if name in whole else bytes(len(files[name])))
    with HubServer({("model", "org/tiny-wan"): {COMMIT: files}}) as hub:
        result = run_snapshot(hub.endpoint, "org/tiny-wan", COMMIT, tmp_path / "model")
        log = list(hub.log)
    assert result.returncode == 0, result.stderr
    assert tree_digest(tmp_path / "model") == tree_digest(tiny_model)
    assert not [r for r in log if r.range], [f"{r.method} {r.path} {r.range}" for r in log if r.range]
    assert not [r for r in log if r.status == 416]
    for name in whole:  # promoted as they were: not asked for at all
        assert not [r for r in log if name in unquote(r.path)], name
    assert [r.method for r in log if r.origin == "storage" and wrong in unquote(r.path)] == ["GET"]  # from byte 0


def test_an_empty_file_of_the_repository_downloads(tiny_model, tmp_path):
    """A file the Hub lists at 0 bytes (a .gitkeep, an empty __init__.py) has no partial file to promote."""
    files = {**files_of(tiny_model), "scheduler/.gitkeep": b""}
    with HubServer({("model", "org/tiny-wan"): {COMMIT: files}}) as hub:
        result = run_snapshot(hub.endpoint, "org/tiny-wan", COMMIT, tmp_path / "model")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "model/scheduler/.gitkeep").read_bytes() == b""


def test_a_416_is_handled_by_one_download_from_byte_0_and_never_a_rerun_loop(archives, tmp_path):
    """The storage holds fewer bytes than a partial file (here: than the listing): a range past its end."""
    files = files_of(archives)
    name = next(n for n in files if n.endswith(".tar.gz"))
    part = partial_dir(tmp_path, "data") / f"{name}.incomplete"
    part.parent.mkdir(parents=True)
    part.write_bytes(files[name][: len(files[name]) * 3 // 4])
    pattern = ["VBVR-Pro-RL-Video/*.tar.gz"]
    with HubServer({("dataset", "org/vbvr"): {COMMIT: files}}, short={name}) as hub:
        first = run_snapshot(hub.endpoint, "org/vbvr", COMMIT, tmp_path / "data", "dataset", pattern)
        answered = [(r.range, r.status) for r in hub.log if r.origin == "storage" and name in unquote(r.path)]
        del hub.log[:]
        second = run_snapshot(hub.endpoint, "org/vbvr", COMMIT, tmp_path / "data", "dataset", pattern)
        again = [(r.range, r.status) for r in hub.log if r.origin == "storage" and name in unquote(r.path)]
    assert answered == [(f"bytes={len(files[name]) * 3 // 4}-", 416), (None, 200)]  # the 416, then byte 0
    served = len(files[name]) // 2
    for result in (first, second):
        assert result.returncode != 0
        assert f"{name}: the server sent {served} bytes in all, the Hub lists {len(files[name])}" in result.stderr
        assert "rerun to resume" not in result.stderr
    assert again == [(None, 200)], "the rerun asks for the whole file, not the same range again"
    assert not part.exists()
    with HubServer({("dataset", "org/vbvr"): {COMMIT: files}}) as hub:
        result = run_snapshot(hub.endpoint, "org/vbvr", COMMIT, tmp_path / "data", "dataset", pattern)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / name).read_bytes() == files[name]


TOKEN = "hf_loopbackGatedToken0123456789abcdef"


def test_a_gated_repository_gets_the_token_with_every_request_and_it_is_written_nowhere(tiny_model, tmp_path):
    files = files_of(tiny_model)
    halves = ["tokenizer/tokenizer.json", "text_encoder/model.safetensors"]  # resumed: a git and an LFS file
    for name in halves:
        part = partial_dir(tmp_path) / f"{name}.incomplete"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(files[name][: len(files[name]) // 2])
    repos = {("model", "org/tiny-wan"): {COMMIT: files}}
    with HubServer(repos, gated={("model", "org/tiny-wan"): TOKEN}) as hub:
        result = fetch_model_stage(hub.endpoint, tmp_path, token=TOKEN)
        log = list(hub.log)
    assert result.returncode == 0, result.stderr
    assert tree_digest(tmp_path / "model") == tree_digest(tiny_model)
    on_hub = [r for r in log if r.origin == "hub"]
    assert {r.method for r in on_hub} == {"GET", "HEAD"} and any("/tree/" in r.path for r in on_hub)
    assert any(r.method == "GET" and "/resolve/" in r.path for r in on_hub), "git files are served by the Hub"
    assert [r.path for r in on_hub if r.range] == [f"/org/tiny-wan/resolve/{COMMIT}/{halves[0]}"]
    lacking = [f"{r.method} {r.path}" for r in on_hub if r.authorization != f"Bearer {TOKEN}"]
    assert not lacking, f"requests to the gated repository without its token: {lacking}"
    assert all(r.status < 400 for r in log), [(r.path, r.status) for r in log if r.status >= 400]
    on_storage = [r for r in log if r.origin == "storage"]
    assert any(r.range for r in on_storage), "the LFS half resumed from storage"
    assert not [r.path for r in on_storage if r.authorization], "the token stays on the Hub (signed storage URLs)"
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert tmp_path / "model.manifest.json" in written and len(written) > len(files)
    holding = [str(p) for p in written if TOKEN.encode() in p.read_bytes() or TOKEN in str(p)]
    assert not holding and TOKEN not in result.stdout + result.stderr, holding


def test_a_gated_repository_without_its_token_is_refused_by_the_server_and_named(tiny_model, tmp_path):
    repos = {("model", "org/tiny-wan"): {COMMIT: files_of(tiny_model)}}
    other = "hf_someOtherAccount9876543210fedcba"
    with HubServer(repos, gated={("model", "org/tiny-wan"): TOKEN}) as hub:
        missing = fetch_model_stage(hub.endpoint, tmp_path, token=None)
        statuses = {r.status for r in hub.log}
        wrong = fetch_model_stage(hub.endpoint, tmp_path, token=other)
    assert statuses == {401}
    assert missing.returncode != 0 and wrong.returncode != 0
    assert f"model org/tiny-wan@{COMMIT}: a gated repository, and $HF_TOKEN is not set (401" in missing.stderr
    assert "a gated repository, and the token in $HF_TOKEN has no access (403" in wrong.stderr
    assert "export HF_TOKEN" in wrong.stderr and other not in wrong.stdout + wrong.stderr
    assert not (tmp_path / "model").exists() and not (tmp_path / "model.manifest.json").exists()
