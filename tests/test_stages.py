"""Every package module a stage can run is covered by the code digest that reruns it."""

import ast
from pathlib import Path

import pytest

import videogrpo
from videogrpo.stages import CODE_PARTS, SHARED_CODE, STAGES

PACKAGE = Path(videogrpo.__file__).parent


def module_file(name: str) -> str | None:
    if not name.startswith("videogrpo"):
        return None
    parts = name.split(".")[1:]
    if not parts:
        return "__init__.py"
    rel = Path(*parts)
    for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
        if (PACKAGE / candidate).is_file():
            return candidate.as_posix()
    return None


def imported_files(rel: str) -> set[str]:
    """Package files `rel` imports (at module level or inside functions), transitively."""
    seen, todo = set(), [rel]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in ast.walk(ast.parse((PACKAGE / current).read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if (found := module_file(name)) and found not in seen:
                    todo.append(found)
    return seen


def covered(rel: str, parts: tuple[str, ...]) -> bool:
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in SHARED_CODE + parts)


@pytest.mark.parametrize("stage", STAGES)
def test_code_digest_of_each_stage_covers_what_it_imports(stage):
    missing = sorted(f for f in imported_files(f"stages/{stage}.py") if not covered(f, CODE_PARTS[stage]))
    assert not missing, f"add to CODE_PARTS[{stage!r}] in stages/__init__.py: {missing}"


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
    from videogrpo.preflight import check_disk_space, transformer_parameters

    params = transformer_parameters(tiny_model)  # read from the safetensors headers
    loaded = WanTransformer3DModel.from_pretrained(tiny_model / "transformer")
    assert params == sum(p.numel() for p in loaded.parameters())
    fits = check_disk_space(config.from_dict({"train": {"keep_checkpoints": 2}}, partial=True), tiny_model, tmp_path)
    assert fits.ok and f"{params:,} parameters" in fits.detail
    huge = config.from_dict({"train": {"keep_checkpoints": 10**9}}, partial=True)
    full = check_disk_space(huge, tiny_model, tmp_path)
    assert not full.ok and "lower train.keep_checkpoints" in full.detail and "GiB free" in full.detail
