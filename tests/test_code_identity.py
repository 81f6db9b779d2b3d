"""The code identity of a stage and of the trainer's math (provenance/code.py): found from the import graph, over
the code's syntax, so that a comment reruns nothing and an edit of what a stage runs reruns it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import videogrpo
from videogrpo.errors import VideoGRPOError
from videogrpo.grpo import checkpoint
from videogrpo.provenance import code
from videogrpo.stages import STAGES

PACKAGE = Path(videogrpo.__file__).parent


@pytest.fixture
def package(tmp_path) -> Path:
    """A copy of the package to edit (named videogrpo, as module names come from the folder)."""
    return Path(shutil.copytree(PACKAGE, tmp_path / "videogrpo", ignore=shutil.ignore_patterns("__pycache__")))


def stage_codes(package: Path) -> dict[str, str]:
    return {stage: code.code_identity((f"videogrpo.stages.{stage}",), package) for stage in STAGES}


def test_a_stage_runs_what_it_imports_lazily_and_what_it_starts_by_module_name():
    train = code.closure(("videogrpo.stages.train",))
    # -m videogrpo.grpo.worker (torchrun), -m videogrpo.rewards.scorer_process (the EvalKit's pool), the node probe
    for module in ("videogrpo.grpo.worker", "videogrpo.rewards.scorer_process", "videogrpo.preflight.node"):
        assert module in train
    assert "videogrpo.grpo.checkpoint_mirror" in train  # imported inside a function only
    generate = code.closure(("videogrpo.stages.generate_cell",))
    assert "videogrpo.grpo.samplers" in generate and "videogrpo.grpo.trainer" not in generate
    assert "videogrpo.demo.tiny_ti2v" in code.closure(("videogrpo.stages.fetch_model",))
    # shared plumbing is no stage's part: its edits rerun nothing
    assert not any(code.is_shared(m) for s in STAGES for m in code.closure((f"videogrpo.stages.{s}",)))


def test_comments_docstrings_and_layout_change_no_code_identity(package):
    before = stage_codes(package)
    samplers = package / "grpo/samplers.py"
    text = samplers.read_text()
    edited = text.replace('"""', '"""A docstring edit that names videogrpo.evaluation.pipelines. ', 1)
    edited = edited.replace("\ndef ", "\n# a comment\n\n\ndef ", 3) + "\n# one more comment line\n"
    samplers.write_text(edited)
    assert stage_codes(package) == before


def test_an_edit_of_the_sampler_changes_the_stages_that_run_it_and_no_other(package):
    before = stage_codes(package)
    samplers = package / "grpo/samplers.py"
    samplers.write_text(samplers.read_text() + "\n\ndef added():\n    return 1\n")
    after = stage_codes(package)
    changed = {stage for stage in STAGES if after[stage] != before[stage]}
    assert {"train", "generate_cell", "preflight"} <= changed
    assert not changed & {"fetch_model", "fetch_dataset", "materialize_dataset", "score_cell", "matrix", "report"}


def test_an_edit_of_shared_plumbing_changes_no_stage(package):
    before = stage_codes(package)
    for rel in ("config/checks.py", "cli.py", "provenance/manifest.py", "stages/common.py"):
        path = package / rel
        path.write_text(path.read_text() + "\n\nSHARED_EDIT = 1\n")
    assert stage_codes(package) == before


def test_a_file_a_module_declares_as_its_package_data_counts_by_its_bytes(package):
    template = package / "provenance/page.css"  # a page template the report would read
    template.write_text("body { margin: 0 }\n")
    page = package / "provenance/report_page.py"
    page.write_text(page.read_text() + '\n\nPACKAGE_DATA = ("page.css",)\n')
    before = stage_codes(package)
    template.write_text("body { margin: 1px }\n")
    after = stage_codes(package)
    assert after["report"] != before["report"] and after["train"] == before["train"]
    template.unlink()
    with pytest.raises(VideoGRPOError, match=r"report_page.py: PACKAGE_DATA names 'page.css', which is not there"):
        stage_codes(package)


@pytest.mark.parametrize("stray", ["trainer.py~", "#trainer.py#", "trainer.py.orig", "notes.txt", "trainer.py.rej"])
def test_an_editor_or_patch_leftover_beside_a_module_changes_no_stage(package, stray):
    before = stage_codes(package)
    trainer = package / "grpo/trainer.py"
    (trainer.parent / stray).write_text(trainer.read_text() + "\nEDITED = 1\n")
    assert stage_codes(package) == before


def test_package_data_declared_by_a_module_is_shipped_with_the_package():
    """What a module declares must be in pyproject's package-data, or an installed package would lack it."""
    import tomllib

    shipped = tomllib.loads((PACKAGE.parent.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped_files = {path for pattern in shipped["package-data"]["videogrpo"] for path in PACKAGE.glob(pattern)}
    for module, path in code.module_files().items():
        for name in code.parsed(path)[3]:
            assert path.parent / name in shipped_files, (module, name)


def test_the_trainer_math_is_what_the_trainer_runs_but_its_logging():
    math = checkpoint.trainer_math()
    for rel in (
        "grpo/loss.py",
        "grpo/samplers.py",
        "grpo/trainer.py",
        "models/wan.py",
        "rewards/rule.py",
        "parallel/fsdp.py",
        "grpo/checkpoint.py",
        "data/dataset.py",
    ):
        assert rel in math, rel
    for rel in ("grpo/tracking.py", "grpo/mlflow_run.py", "grpo/flops.py", "launch/torchrun.py", "cli.py"):
        assert rel not in math, rel
    assert all(len(value) == 64 for value in math.values())


def test_the_parse_cache_is_reused_until_a_file_changes_and_a_broken_cache_is_ignored(package, monkeypatch):
    module = package / "grpo" / "samplers.py"
    first = code._ParseCache(package)
    digest = first.get(module)[0]
    first.save()
    assert (package / "__pycache__" / "code-identity.json").is_file()

    def no_parse(path):
        raise AssertionError(f"{path} parsed again although unchanged")

    with monkeypatch.context() as patch:
        patch.setattr(code, "_parse", no_parse)
        assert code._ParseCache(package).get(module)[0] == digest  # from the file, not parsed

    module.write_text(module.read_text() + "\nEDITED = 1\n")  # a new size and mtime: parsed again
    assert code._ParseCache(package).get(module)[0] != digest

    (package / "__pycache__" / "code-identity.json").write_text("{not json")
    assert code._ParseCache(package).get(module)[0] == code._parse(module)[0]
