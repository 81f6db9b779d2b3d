import json

import pytest

from videogrpo.errors import VideoGRPOError
from videogrpo.provenance.manifest import StageRun, read_manifest


def test_manifest_records_inputs_outputs_params_and_versions(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("input")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "a.bin").write_bytes(b"a")
    with StageRun("demo", tmp_path / "m.json", inputs={"source": src}, params={"k": 1}) as stage:
        stage.output("dir", out_dir)
        stage.summary = {"n": 1}
    manifest = read_manifest(tmp_path / "m.json")
    assert manifest["stage"] == "demo" and manifest["params"] == {"k": 1}
    assert manifest["inputs"]["source"]["sha256"] == __import__("hashlib").sha256(b"input").hexdigest()
    out = manifest["outputs"]["dir"]
    assert out["kind"] == "directory" and out["files"] == 1 and len(out["tree_sha256"]) == 64
    assert out["entries"]["a.bin"][1] == 1
    assert {"python", "torch", "videogrpo"} <= set(manifest["versions"])
    assert manifest["ended_at"] >= manifest["started_at"]


def test_failed_stage_writes_no_manifest(tmp_path):
    with pytest.raises(RuntimeError):
        with StageRun("demo", tmp_path / "m.json", inputs={}):
            raise RuntimeError("stage failed")
    assert not (tmp_path / "m.json").exists()


def test_secrets_never_reach_a_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret_value")
    with pytest.raises(VideoGRPOError, match=r"refusing to write the value of \$HF_TOKEN"):
        with StageRun("demo", tmp_path / "m.json", inputs={}, params={"oops": "hf_supersecret_value"}):
            pass
    assert not (tmp_path / "m.json").exists()


def test_unreadable_manifest_says_which_stage_to_rerun(tmp_path):
    (tmp_path / "m.json").write_text("{")
    with pytest.raises(VideoGRPOError, match="not valid JSON"):
        read_manifest(tmp_path / "m.json")
    (tmp_path / "v.json").write_text(json.dumps({"manifest_version": 0}))
    with pytest.raises(VideoGRPOError, match="manifest_version 0, expected 1"):
        read_manifest(tmp_path / "v.json")
