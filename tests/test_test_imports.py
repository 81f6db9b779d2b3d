"""Tests share code through helper modules beside them (conftest.py, harness.py, demo.py, the stand-in servers and
workers: no `test_` prefix) or through the package, never by importing a test module or bench/.

A test module that others import is a library nobody reads as one: its constants become what other tests check,
and the copy someone writes instead drifts from them; a `test_` name imported from it is collected again in the
importer, and it imports only while pytest puts tests/ on sys.path (the default prepend mode, not
`--import-mode=importlib`). bench/ holds benchmarks that import the package, not a
library the tests may lean on: a bench script edited for a measurement would change what a test checks. The scan
reads every Python file under tests/, lazy imports inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in `tree`; `from pkg import name` gives pkg.name too, since the
    name may be a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base.rstrip('.')}.{alias.name}".lstrip(".")) for alias in node.names]
    return found


def forbidden(module: str) -> str | None:
    """Why importing `module` from a test file breaks the rule, or None."""
    parts = [part for part in module.split(".") if part]
    if parts and parts[0] == "bench":
        return "imports bench/ (move what it shares into the package, which bench imports too)"
    if any(part.startswith("test_") for part in parts):
        return "imports a test module (move what it shares into a helper module under tests/, or the package)"
    return None


def violations(root: Path) -> list[str]:
    """One line per offending import statement: the file, the line, the module imported and the fix."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for line, module in imported_names(ast.parse(path.read_text(), filename=str(path))):
            why = forbidden(module)
            if why:
                found.setdefault(f"{path.relative_to(root)}:{line}", f"{module} {why}")
    return [f"{where}: {what}" for where, what in sorted(found.items())]


def test_no_test_file_imports_a_test_module_or_bench():
    assert violations(TESTS) == []


def test_the_scan_finds_each_kind_of_forbidden_import(tmp_path):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "test_a.py").write_text("from test_flops import MID\nfrom harness import trainer_config\n")
    (tmp_path / "gpu" / "test_b.py").write_text("import torch\n\n\ndef f():\n    from bench.gpu_smoke import MID\n")
    (tmp_path / "helper.py").write_text("from bench import gpu_smoke\nimport test_judge as t\nfrom . import test_c\n")
    (tmp_path / "test_d.py").write_text("from videogrpo.models.shapes import MID_TI2V\nfrom torch import testing\n")
    test_module = "imports a test module (move what it shares into a helper module under tests/, or the package)"
    bench = "imports bench/ (move what it shares into the package, which bench imports too)"
    assert violations(tmp_path) == sorted(
        [
            f"gpu/test_b.py:5: bench.gpu_smoke {bench}",
            f"helper.py:1: bench {bench}",
            f"helper.py:2: test_judge {test_module}",
            f"helper.py:3: test_c {test_module}",
            f"test_a.py:1: test_flops {test_module}",
        ]
    )
