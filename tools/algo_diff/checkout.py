"""Reading an authors' file from a checkout: a clone, a bare mirror or a plain tree (never copied into this project);
and the comparison every algo_diff tool prints."""

from __future__ import annotations

import ast
import subprocess
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
