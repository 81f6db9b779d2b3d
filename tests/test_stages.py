"""Stage plumbing: a full disk, preflight's room for checkpoints, the data stages' progress."""

from pathlib import Path

import pytest

from videogrpo.progress import human_bytes

from harness import data_stage


def test_a_full_disk_is_named_with_the_file_and_the_fix(monkeypatch, capsys):
    import errno

    from videogrpo import cli

    def full(_args):
        raise OSError(errno.ENOSPC, "No space left on device", "results/runs/x/checkpoints/step-00000100/dcp")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda command=None: parser)
    args = parser.parse_args(["schema"])
    args.handler = full
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "no space left on device writing results/runs/x/checkpoints/step-00000100/dcp" in err
    assert "free space on that file system" in err and "training resumes" in err


def test_preflight_checks_room_for_the_checkpoints_it_will_keep(tiny_model, tmp_path):
    from diffusers import WanTransformer3DModel

    from videogrpo import config
    from videogrpo.preflight.checks import check_disk_space, transformer_parameters

    params = transformer_parameters(tiny_model)  # read from the safetensors headers
    loaded = WanTransformer3DModel.from_pretrained(tiny_model / "transformer")
    assert params == sum(p.numel() for p in loaded.parameters())
    fits = check_disk_space(config.from_dict({"train": {"keep_checkpoints": 2}}, partial=True), tiny_model, tmp_path)
    assert fits.ok and f"{params:,} parameters" in fits.detail
    # A tiny model needs kilobytes: shown in the unit that shows them, never "need 0.0 GiB".
    assert f"export need {human_bytes(params * 12 * 3 + params * 4)}" in fits.detail
    assert "0.0 " not in fits.detail
    huge = config.from_dict({"train": {"keep_checkpoints": 10**9}}, partial=True)
    full = check_disk_space(huge, tiny_model, tmp_path)
    assert not full.ok and "lower train.keep_checkpoints" in full.detail and "B free" in full.detail


def test_byte_counts_are_shown_in_the_unit_that_shows_them():
    assert [human_bytes(n) for n in (0, 512, 1536, 5 * 1024**2, 3 * 1024**3)] == [
        "0 B",
        "512 B",
        "1.5 KB",
        "5.0 MB",
        "3.0 GB",
    ]


@pytest.fixture
def fetched(tmp_path, repo) -> Path:
    archives = tmp_path / "archives"
    done = data_stage(tmp_path, "fetch-dataset", "--out", str(archives))
    assert done.returncode == 0, done.stderr
    return archives


def test_materialize_refuses_archives_no_fetch_record_vouches_for(tmp_path, repo, fetched):
    """Today's silent skip: with no fetch record found, no archive's SHA-256 was checked before the unpack."""
    import shutil

    fetch_manifest = tmp_path / "fetch-dataset.manifest.json"
    out = tmp_path / "materialized"
    alone = data_stage(tmp_path, "materialize-dataset", "--archives", str(fetched), "--out", str(out))
    assert alone.returncode == 4, alone.stderr
    assert f"{fetched}: no fetch_dataset record of these archives" in alone.stderr
    assert "manifests looked in: none (no --upstream given)" in alone.stderr
    assert "Give fetch_dataset's manifest with --upstream" in alone.stderr
    copied = Path(shutil.copytree(fetched, tmp_path / "copied"))  # the same bytes where no record names them
    args = ["--archives", str(copied), "--out", str(out), "--upstream", str(fetch_manifest)]
    elsewhere = data_stage(tmp_path, "materialize-dataset", *args)
    assert elsewhere.returncode == 4, elsewhere.stderr
    assert f"manifests looked in: {fetch_manifest} (records no output at that path)" in elsewhere.stderr
    assert not [p for p in (out / "raw").rglob("*") if p.is_file()], "nothing unpacked from unchecked archives"
    assert not (tmp_path / "materialize-dataset.manifest.json").exists()
    args = ["--archives", str(fetched), "--out", str(out), "--upstream", str(fetch_manifest)]
    assert data_stage(tmp_path, "materialize-dataset", *args).returncode == 0


def test_a_stage_refuses_an_input_its_upstream_manifests_do_not_record(tmp_path, repo, fetched):
    """validate_dataset handed the wrong manifest: nothing it reads could be checked, so it refuses."""
    out = tmp_path / "materialized"
    args = ["--archives", str(fetched), "--out", str(out), "--upstream", str(tmp_path / "fetch-dataset.manifest.json")]
    assert data_stage(tmp_path, "materialize-dataset", *args).returncode == 0
    validate = ["--dataset", str(out), "--out", str(tmp_path / "validation.json")]
    wrong = data_stage(
        tmp_path, "validate-dataset", *validate, "--upstream", str(tmp_path / "fetch-dataset.manifest.json")
    )
    assert wrong.returncode == 4, wrong.stderr
    assert (
        f"{out / 'dataset.json'}: input dataset_index is recorded as an output by none of the upstream" in wrong.stderr
    )
    assert f"fetch_dataset ({tmp_path / 'fetch-dataset.manifest.json'})" in wrong.stderr
    assert not (tmp_path / "validation.json").exists()
    right = data_stage(
        tmp_path, "validate-dataset", *validate, "--upstream", str(tmp_path / "materialize-dataset.manifest.json")
    )
    assert right.returncode == 0, right.stderr


def test_an_evaluation_tree_that_does_not_exist_is_named_by_its_field(tmp_path):
    import json
    import subprocess
    import sys

    missing = tmp_path / "VBVR-Pro-Eval"
    sections = {"matrix": {"eval_set": str(missing), "eval_set_digest": "ab" * 32}}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "videogrpo"), "stage", "eval-set", "--config-json", json.dumps(sections)]
        + ["--tree", str(missing), "--samples", str(tmp_path / "s.json"), "--final-frames", str(tmp_path / "ff")]
        + ["--manifest", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 3, out.stderr  # a configuration error, not a traceback
    assert f"matrix.eval_set = {str(missing)!r}: no such directory" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "m.json").exists()
