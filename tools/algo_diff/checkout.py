"""Reading an authors' file from a checkout: a clone, a bare mirror or a plain tree (never copied into this project);
and the comparison every algo_diff tool prints."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import tempfile
import textwrap
from pathlib import Path


def read_source(source: Path, commit: str, path: str) -> tuple[str, str]:
    """(the text of `path` in `source` at `commit`, the commit or "unknown (not a git checkout)")."""
    if (source / path).is_file() and not (source / ".git").exists():
        return (source / path).read_text(), "unknown (not a git checkout)"
    git = ["git", "-C", str(source)]
    found = subprocess.run([*git, "rev-parse", f"{commit}^{{commit}}"], capture_output=True, text=True)
    if found.returncode:
        raise OSError(f"{source}: no commit {commit!r} ({found.stderr.strip()})")
    where = found.stdout.strip()
    shown = subprocess.run([*git, "show", f"{where}:{path}"], capture_output=True, text=True)
    if shown.returncode:
        raise OSError(f"{source}: no {path} at {where} ({shown.stderr.strip()})")
    return shown.stdout, where


def load_module(source: Path, commit: str, path: str, name: str) -> tuple:
    """(the authors' file `path` in `source` at `commit`, run as module `name` from a temporary copy, the commit or
    "unknown (not a git checkout)"): their code is loaded by path, never copied into this project."""
    text, where = read_source(source, commit, path)
    copy = Path(tempfile.mkdtemp()) / Path(path).name
    copy.write_text(text)
    spec = importlib.util.spec_from_file_location(name, copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, where


def load_package(source: Path, commit: str, directory: str, names: list[str], package: str) -> tuple[dict, str]:
    """({name: module} of the authors' files `directory/<name>.py` in `source` at `commit`, imported as the package
    `package` from a temporary copy so that their relative imports resolve; the commit of the first)."""
    import importlib
    import sys

    root = Path(tempfile.mkdtemp()) / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    where = None
    for name in names:
        text, found = read_source(source, commit, f"{directory}/{name}.py")
        (root / f"{name}.py").write_text(text)
        where = where or found
    spec = importlib.util.spec_from_file_location(package, root / "__init__.py", submodule_search_locations=[str(root)])
    sys.modules[package] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[package])
    return {name: importlib.import_module(f"{package}.{name}") for name in names}, where


def function_source(text: str, name: str) -> str:
    """The source of the top-level function `name` of a module's text."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
    raise OSError(f"no top-level function {name!r}")


def block_source(text: str, first: str, last: str) -> str:
    """The lines from the first one containing `first` to the next one containing `last` (both kept), dedented:
    a block of a training loop run on its own in a namespace that holds the loop's variables."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if first in line), None)
    if start is None:
        raise OSError(f"no line containing {first!r}")
    end = next((i for i in range(start, len(lines)) if last in lines[i]), None)
    if end is None:
        raise OSError(f"no line containing {last!r} after {first!r}")
    return textwrap.dedent("\n".join(lines[start : end + 1]))


def relative_differences(theirs: dict, ours: dict, tolerance: float) -> list[tuple[str, float, bool]]:
    """(name, largest difference relative to the largest magnitude, within `tolerance`) per output of `ours`."""
    rows = []
    for name, mine in ours.items():
        scale = max(float(theirs[name].abs().max()), 1e-12)
        worst = float((mine.double() - theirs[name].double()).abs().max()) / scale
        rows.append((name, worst, worst <= tolerance))
    return rows


def arguments(doc: str, repository: str, argv: list[str] | None) -> argparse.Namespace:
    """A tool's command line: the checkout (`args.checkout`), --commit and --store."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("checkout", type=Path, help=f"a {repository} checkout, git directory or plain tree")
    parser.add_argument("--commit", default="HEAD", help="the commit of a clone or mirror (default HEAD)")
    parser.add_argument("--store", type=Path, help="write the inputs and the authors' outputs to this file")
    return parser.parse_args(argv)


def print_rows(rows: list[tuple[str, float, bool]], indent: str = "  ") -> bool:
    """Print each comparison's verdict; whether every one is within round-off."""
    for name, worst, ok in rows:
        print(f"{indent}{name:14s} largest relative difference {worst:.2e}  {'PASS' if ok else 'FAIL'}")
    return all(ok for *_, ok in rows)


def store(path: Path | None, stored: dict) -> None:
    """With --store: the inputs and the authors' outputs, for tests/test_algo_diff.py."""
    if path is None:
        return
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(stored, path)
    print(f"stored the inputs and their outputs in {path}")


def run_comparison(doc: str, repository: str, argv: list[str] | None, tool, load) -> int:
    """A tool's command line: `load(checkout, commit)` gives (what the authors' side needs of their code, the commit);
    `tool` (the tool's own module) gives `inputs()`, `authors_side(loaded, data)`, `project_side(data)`,
    `compare(theirs, ours)` and `HEADER` (what the run compares, after the commit). Exit status: 0 all within
    round-off, 1 one is not, 2 it could not run."""
    import sys

    args = arguments(doc, repository, argv)
    try:
        loaded, commit = load(args.checkout.resolve(), args.commit)
        data = tool.inputs()
        theirs = tool.authors_side(loaded, data)
    except (OSError, ImportError) as err:
        print(
            f"{Path(tool.__file__).stem}: could not run {repository}'s code at {args.checkout}: {err}", file=sys.stderr
        )
        return 2
    print(f"{repository} at {commit}: {tool.HEADER}")
    ok = print_rows(tool.compare(theirs, tool.project_side(data)))
    store(args.store, {"commit": commit, "inputs": data, "theirs": theirs})
    return 0 if ok else 1


def run_module_comparison(doc: str, repository: str, argv: list[str] | None, path: str, tool) -> int:
    """`run_comparison` of a tool that loads one authors' file, `path`, as a module."""
    return run_comparison(
        doc,
        repository,
        argv,
        tool,
        lambda checkout, commit: load_module(checkout, commit, path, f"authors_{Path(path).stem}"),
    )
