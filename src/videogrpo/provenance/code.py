"""Code identity: which of the package's modules a piece of work runs, and one digest of them over their syntax.

Snakemake sees a rule's own text, not the modules its command imports, so every stage's rule carries the
digest of the code it runs as a param, and the trainer's checkpoints record the digest of the code that
computes an update. Both mean the same thing:
- the parts are found, not listed by hand: the import closure of a root module, over every
  `import videogrpo...` / `from videogrpo... import ...` anywhere in a module (functions import lazily), plus
  every module a string names in full (`python -m videogrpo.grpo.worker`, `importlib.import_module(...)`),
  plus the `__init__.py` of each package on the way (importing a module runs them);
- a module's digest is that of its syntax tree without docstrings (`digest.code_digest`): comments, docstrings
  and layout never count;
- a file that is not Python counts, by its bytes, only when the module that reads it declares it: a module-level
  `PACKAGE_DATA = ("page.css", ...)` of names beside the module (and shipped: pyproject's package-data). An
  editor's backup (`trainer.py~`, `#trainer.py#`), a patch's `.orig` or a note beside a module is no part of
  anything, so it reruns nothing.

Shared plumbing (`SHARED`: the CLI, the error type, atomic writes, progress, config, the manifest writer, the
workflow helpers) is neither part nor traversed: its effects show in config values and manifests, so an edit
there reruns no stage.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

from videogrpo import atomic
from videogrpo.errors import VideoGRPOError
from videogrpo.provenance.digest import sha256_bytes, sha256_file, strip_docstrings, tree_digest_of_entries

PACKAGE = "videogrpo"
PACKAGE_DIR = Path(__file__).resolve().parent.parent

# Shared plumbing whose edits rerun no stage: these modules, and these packages with everything under them.
SHARED_MODULES = frozenset(
    {
        "videogrpo",
        "videogrpo.cli",
        "videogrpo.errors",
        "videogrpo.atomic",
        "videogrpo.progress",
        "videogrpo.provenance.digest",
        "videogrpo.provenance.manifest",
        "videogrpo.provenance.cost",
        "videogrpo.provenance.code",
        # The interconnect variables: environment that manifests record, never what a stage computes.
        "videogrpo.provenance.interconnect",
        # Which rows of metrics.jsonl are updates and which validation points: the file's format, as the manifest's.
        "videogrpo.provenance.metric_rows",
        "videogrpo.stages",
        "videogrpo.stages.common",
    }
)
SHARED_PACKAGES = ("videogrpo.config", "videogrpo.pipeline")
_NAMED = re.compile(r"\bvideogrpo(?:\.[A-Za-z_]\w*)+")


def is_shared(module: str) -> bool:
    return module in SHARED_MODULES or any(module == p or module.startswith(p + ".") for p in SHARED_PACKAGES)


def module_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Dotted module name -> its file, for every Python file of the package (a package by its __init__.py)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if all(p.isidentifier() for p in parts):  # not a data folder shipped with the package (a stand-in checkout)
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` denotes: itself, or the longest module prefix of it (`pkg.mod.attr` -> `pkg.mod`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


DATA_DECLARATION = "PACKAGE_DATA"


def _declared_data(tree: ast.Module, path: Path) -> tuple[str, ...]:
    """The names a module-level `PACKAGE_DATA = (...)` declares: string literals only, since the identity is found
    without running the module."""
    found: tuple[str, ...] = ()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if not any(isinstance(t, ast.Name) and t.id == DATA_DECLARATION for t in targets):
            continue
        value = node.value
        if not (
            isinstance(value, (ast.Tuple, ast.List))
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)
        ):
            raise ValueError(f"{path}: {DATA_DECLARATION} must be a tuple of string literals (file names beside it)")
        found = tuple(e.value for e in value.elts)
    return found


def _parse(path: Path) -> tuple[str, frozenset[str], frozenset[str], tuple[str, ...]]:
    """(code digest, dotted names it imports, dotted names its strings name, package data it declares) of a Python
    file."""
    tree = strip_docstrings(ast.parse(path.read_text(encoding="utf-8")))
    imported: set[str] = set()
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.update(f"{node.module}.{a.name}" for a in node.names)  # a submodule, or a name in the module
            imported.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named.update(_NAMED.findall(node.value))
    digest = sha256_bytes(ast.dump(tree, include_attributes=False).encode())

    def ours(names: set[str]) -> frozenset[str]:
        return frozenset(n for n in names if n == PACKAGE or n.startswith(PACKAGE + "."))

    return digest, ours(imported), ours(named), _declared_data(tree, path)


class _ParseCache:
    """Parsed files by (size, mtime_ns), kept in memory and in `__pycache__/code-identity.json` beside the package.

    Every stage job computes its code identity, and parsing the package's syntax trees costs about a second
    and a half of CPU a job. The file is keyed like Python's own bytecode cache (a source's size and
    modification time) and is only ever an accelerator: unreadable, stale or from another version, it is
    ignored and rebuilt; a read-only package simply goes without it.
    """

    VERSION = 2

    def __init__(self, package_dir: Path | None):
        self.file = package_dir / "__pycache__" / "code-identity.json" if package_dir else None
        self.entries: dict[str, list] | None = None
        self.dirty = False

    def _load(self) -> dict[str, list]:
        if self.file is None:
            return {}
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            return data["files"] if data.get("version") == self.VERSION else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def get(self, path: Path) -> tuple[str, frozenset[str], frozenset[str], tuple[str, ...]]:
        if self.entries is None:
            self.entries = self._load()
        st = path.stat()
        key = str(path)
        entry = self.entries.get(key)
        if isinstance(entry, list) and len(entry) == 6 and entry[:2] == [st.st_size, st.st_mtime_ns]:
            return entry[2], frozenset(entry[3]), frozenset(entry[4]), tuple(entry[5])
        digest, imported, named, data = _parse(path)
        self.entries[key] = [st.st_size, st.st_mtime_ns, digest, sorted(imported), sorted(named), list(data)]
        self.dirty = True
        return digest, imported, named, data

    def save(self) -> None:
        if not self.dirty or self.entries is None or self.file is None:
            return
        self.dirty = False
        text = json.dumps({"version": self.VERSION, "files": self.entries}, sort_keys=True)
        try:
            self.file.parent.mkdir(exist_ok=True)
            atomic.write_text(self.file, text)
        except OSError:
            pass  # a read-only install: parse each time


@functools.cache
def _cache(package_dir: Path | None) -> _ParseCache:
    return _ParseCache(package_dir)


def parsed(path: Path) -> tuple[str, frozenset[str], frozenset[str], tuple[str, ...]]:
    """(code digest, dotted names of this package it imports, those its strings name, the package data it declares)
    of a Python file."""
    # Only this installed package keeps its cache on disk; another tree (a test's copy) parses in memory.
    return _cache(PACKAGE_DIR if path.is_relative_to(PACKAGE_DIR) else None).get(path)


def _edges(name: str, modules: dict[str, Path], named: bool = True) -> frozenset[str]:
    _, imports, names, _ = parsed(modules[name])
    resolved = (_resolve(dotted, modules) for dotted in (imports | names if named else imports))
    return frozenset(m for m in resolved if m)


def import_graph(package_dir: Path = PACKAGE_DIR, named: bool = True) -> dict[str, frozenset[str]]:
    """Module -> the package's modules it imports and, with `named`, those its strings name (`-m ...`)."""
    modules = module_files(package_dir)
    return {name: _edges(name, modules, named) for name in modules}


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(roots: tuple[str, ...], package_dir: Path = PACKAGE_DIR, leave_out: tuple[str, ...] = ()) -> list[str]:
    """The modules that running `roots` runs, sorted: shared plumbing and `leave_out` neither counted nor followed."""
    modules = module_files(package_dir)
    seen: set[str] = set()
    todo = [parent for root in roots for parent in _with_parents(root)]
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        if is_shared(module) or module in leave_out:
            continue
        for dep in _edges(module, modules):  # parsed as reached: a stage's closure, not the whole package
            todo.extend(_with_parents(dep))
    return sorted(m for m in seen if not is_shared(m) and m not in leave_out)


def _rel(path: Path, package_dir: Path) -> str:
    return path.relative_to(package_dir).as_posix()


def part_digests(modules: list[str], package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """Package-relative path -> digest, for each module's file and the package data it declares (nothing else
    beside it counts)."""
    files = module_files(package_dir)
    digests = {}
    for module in modules:
        path = files[module]
        digest, _, _, data = parsed(path)
        digests[_rel(path, package_dir)] = digest
        for name in data:
            declared = path.parent / name
            if not declared.is_file():
                raise VideoGRPOError(
                    f"{path}: {DATA_DECLARATION} names {name!r}, which is not there ({declared}); restore it, or drop "
                    f"it from {DATA_DECLARATION}"
                )
            digests[_rel(declared, package_dir)] = sha256_file(declared)
    return dict(sorted(digests.items()))


def code_identity(roots: tuple[str, ...], package_dir: Path = PACKAGE_DIR) -> str:
    """One digest of the code `roots` run (64 hex): the rule param of a stage, the key of its resumable work."""
    parts = part_digests(closure(roots, package_dir), package_dir)
    _cache(PACKAGE_DIR).save()
    return tree_digest_of_entries({rel: (digest, 0) for rel, digest in parts.items()})


def stage_code(stage: str) -> str:
    """The code identity of a workflow stage: its module `videogrpo.stages.<stage>` and all it runs."""
    return code_identity((f"videogrpo.stages.{stage}",))
