import json

import pytest

from videogrpo.errors import VideoGRPOError
from videogrpo.provenance import manifest as manifest_module
from videogrpo.provenance.manifest import StageRun, read_manifest, write_manifest


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


def test_a_streamed_manifest_is_the_indented_json_and_secrets_across_blocks_are_found(tmp_path, monkeypatch):
    entries = {f"t/s{i:06d}/video/ground_truth.mp4": ["ab" * 32, i] for i in range(30_000)}
    big = {"outputs": {"raw": {"entries": entries}}}
    write_manifest(tmp_path / "big.json", big)  # over two blocks of text
    assert (tmp_path / "big.json").read_text() == json.dumps(big, indent=2, sort_keys=True) + "\n"
    # One piece of the encoder per block: a secret that spans a key, its separator and its value still shows.
    monkeypatch.setattr(manifest_module, "_BLOCK", 1)
    monkeypatch.setenv("HF_TOKEN", 'token": "value123')
    write_manifest(tmp_path / "fine.json", {"token": "value12"})
    with pytest.raises(VideoGRPOError, match=r"refusing to write the value of \$HF_TOKEN"):
        write_manifest(tmp_path / "leak.json", {"token": "value1234"})
    assert not (tmp_path / "leak.json").exists() and not list(tmp_path.glob(".leak*"))


def test_unreadable_manifest_says_which_stage_to_rerun(tmp_path):
    (tmp_path / "m.json").write_text("{")
    with pytest.raises(VideoGRPOError, match="not valid JSON"):
        read_manifest(tmp_path / "m.json")
    (tmp_path / "v.json").write_text(json.dumps({"manifest_version": 0}))
    with pytest.raises(VideoGRPOError, match="manifest_version 0, expected 1"):
        read_manifest(tmp_path / "v.json")


def upstream_stage(tmp_path):
    """An upstream stage that made a file and a directory, and its manifest."""
    table, tree = tmp_path / "per_task.csv", tmp_path / "final"
    table.write_text("task,score\nA,0.5\n")
    tree.mkdir()
    (tree / "weights.bin").write_bytes(b"\x00" * 64)
    (tree / "config.json").write_text("{}")
    with StageRun("evaluate", tmp_path / "up.json", inputs={}) as stage:
        stage.output("table", table)
        stage.output("final", tree)
    return table, tree, tmp_path / "up.json"


def test_inputs_are_checked_against_the_upstream_manifest(tmp_path):
    from videogrpo.errors import DigestMismatch
    from videogrpo.provenance.digest import sha256_file

    table, tree, up = upstream_stage(tmp_path)
    with StageRun("report", tmp_path / "ok.json", inputs={"table": table, "final": tree}, upstream=[up]):
        pass  # untouched inputs pass
    recorded = sha256_file(table)
    table.write_text("task,score\nA,0.9\n")  # a hand edit
    with pytest.raises(DigestMismatch) as err:
        with StageRun("report", tmp_path / "m.json", inputs={"table": table}, upstream=[up]):
            pass
    message = str(err.value)
    assert f"{table}: input table is not what evaluate made ({up})" in message
    assert f"recorded {recorded}" in message and f"found    {sha256_file(table)}" in message
    assert "snakemake --forcerun evaluate" in message and not (tmp_path / "m.json").exists()
    (tree / "weights.bin").write_bytes(b"\x00" * 63 + b"\x01")  # one flipped byte in a directory output
    with pytest.raises(
        DigestMismatch,
        match=r"input final is not what evaluate made.*\n.*\n.*\n  files that differ: "
        r"weights.bin\n",
    ):
        with StageRun("evaluate", tmp_path / "m.json", inputs={"final": tree}, upstream=[up]):
            pass


def test_every_manifest_records_the_git_state_when_its_stage_ran(tmp_path, monkeypatch):
    import subprocess

    from videogrpo.provenance.manifest import git_state

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    for name in ("alpha.py", "beta.py", "gamma.py"):
        (tmp_path / name).write_text(name)
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "alpha.py").write_text("changed")  # the first porcelain line starts with a space: " M alpha.py"
    git("mv", "beta.py", "delta.py")
    (tmp_path / "new.txt").write_text("untracked")
    monkeypatch.chdir(tmp_path)
    with StageRun("demo", tmp_path / "m.json", inputs={}):
        (tmp_path / "later.txt").write_text("made while the stage ran")
    recorded = read_manifest(tmp_path / "m.json")["git"]
    assert recorded["dirty"] is True and len(recorded["commit"]) == 40
    assert sorted(recorded["changed_files"]) == ["alpha.py", "delta.py"]
    assert recorded["untracked_files"] == ["new.txt"]  # as at the start of the stage
    assert git_state(tmp_path.parent / "not-a-repo-here") is None


def test_an_input_no_upstream_manifest_records_is_refused_unless_external(tmp_path):
    """A record that cannot be found is no reason to skip the check (a moved results directory, a lost rule input)."""
    from videogrpo.errors import DigestMismatch

    table, tree, up = upstream_stage(tmp_path)
    moved = tmp_path / "elsewhere" / "per_task.csv"  # the same bytes, at a path the manifest does not name
    moved.parent.mkdir()
    moved.write_bytes(table.read_bytes())
    with pytest.raises(DigestMismatch) as err:
        with StageRun("report", tmp_path / "m.json", inputs={"table": moved, "final": tree}, upstream=[up]):
            pass
    message = str(err.value)
    assert f"{moved}: input table is recorded as an output by none of the upstream manifests evaluate ({up})" in message
    assert "give that stage's manifest with --upstream" in message and "snakemake --forcerun" in message
    assert not (tmp_path / "m.json").exists()
    checkout = tmp_path / "evalkit"
    checkout.mkdir()
    (checkout / "run.py").write_text("pass\n")
    inputs = {"table": table, "evalkit": checkout, "upstream_record": up}  # a manifest of its own is no output
    with StageRun("evaluate", tmp_path / "ok.json", inputs=inputs, upstream=[up], external=("evalkit",)) as stage:
        with pytest.raises(DigestMismatch, match="input late is recorded as an output by none"):
            stage.input("late", moved, known={})
    assert set(read_manifest(tmp_path / "ok.json")["inputs"]) == {"table", "evalkit", "upstream_record"}


def test_an_input_inside_an_upstream_directory_is_checked_against_its_file_list(tmp_path):
    """generate_cell reads train's final/transformer; a file of a recorded tree is checked too."""
    from videogrpo.errors import DigestMismatch

    _, tree, up = upstream_stage(tmp_path)
    (tree / "transformer").mkdir()
    (tree / "transformer" / "model.safetensors").write_bytes(b"weights")
    with StageRun("evaluate", tmp_path / "up2.json", inputs={}) as stage:
        stage.output("final", tree)
    up = tmp_path / "up2.json"
    inputs = {"transformer": tree / "transformer", "config": tree / "config.json"}
    with StageRun("generate_cell", tmp_path / "ok.json", inputs=inputs, upstream=[up]):
        pass
    (tree / "transformer" / "model.safetensors").write_bytes(b"weightz")
    with pytest.raises(DigestMismatch, match=r"input transformer is not what evaluate made(.|\n)*differ: model"):
        with StageRun("generate_cell", tmp_path / "m.json", inputs=inputs, upstream=[up]):
            pass
    (tree / "extra.json").write_text("{}")  # in the directory, not in its record
    with pytest.raises(
        DigestMismatch, match=r"input extra is not what evaluate made \(.*\)\n  recorded \(no such file"
    ):
        with StageRun("generate_cell", tmp_path / "m.json", inputs={"extra": tree / "extra.json"}, upstream=[up]):
            pass
