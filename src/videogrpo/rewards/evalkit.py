"""Fingerprints of the EvalKit: its source digest (docs/reference-system.md#rule-reward), and the scorer runtime
probe a scorer
process runs (`scorer_process.check_runtime` starts one for `check_scorer_runtime`): the runtime contract's
packages, and the modules the public EvalKit imports at module level (`EVALKIT_MODULE_IMPORTS`)."""

from __future__ import annotations

import sys
from pathlib import Path

from videogrpo.errors import ConfigError, DigestMismatch, VideoGRPOError
from videogrpo.provenance import digest


def uses_easyocr(root: Path, files: list[str]) -> bool:
    return any("easyocr.Reader" in (root / rel).read_text(errors="replace") for rel in files if rel.endswith(".py"))


def check_checkout(path: str | Path) -> Path:
    """The EvalKit checkout at evalkit.path, or an error naming the field and how to fix it."""
    root = Path(path)
    if not (root / "run_evaluation.py").is_file():
        where = "no such directory" if not root.is_dir() else "no run_evaluation.py there"
        raise ConfigError(
            f"evalkit.path = {str(root)!r}: {where}; point it at an EvalKit checkout "
            f"(run_evaluation.py, vbvr_bench/, annotations/) whose source digest is evalkit.digest. The "
            f"EvalKit is not vendored: clone it into external/ (docs/recipes.md, 'The VBVR EvalKit checkout', says "
            f"which "
            f"revision each recipe pins and how to pin the public one instead)"
        )
    return root


def fingerprint(path: str | Path, expected: str, easyocr_models: str = "easyocr_models") -> dict:
    """Compute the source digest of an EvalKit checkout and compare it with the pinned one."""
    root = check_checkout(path)
    files = digest.evalkit_files(root)
    found = digest.digest_length_prefixed(root, files)
    # Where the checkout lives is no part of it (evalkit.path is an execution field): the manifest records it.
    record = {
        "source_sha256": found,
        "expected_sha256": expected,
        "files": len(files),
        "listing": {rel: digest.sha256_file(root / rel) for rel in files},
    }
    if uses_easyocr(root, files):
        models = root / easyocr_models
        if not models.is_dir():
            raise VideoGRPOError(
                f"{root}: the evaluators use easyocr.Reader but {models} is missing; link the folder of EasyOCR "
                f"weights there (evalkit.easyocr_models names it, relative to the checkout)"
            )
        record["easyocr_models"] = easyocr_models  # as configured: relative to the checkout, wherever it is
        record["easyocr_models_tree_sha256"] = digest.tree_digest(models)
    check_digest(root, expected, found)
    return record


def check_digest(root: str | Path, expected: str, found: str | None = None) -> str:
    """The checkout's source digest (`found`, or computed now), refused unless it is `expected` (evalkit.digest).
    Also called where the EvalKit is read: an edit that keeps a file's time, or one made after
    fingerprint_evalkit, is seen by no rule."""
    found = found or digest.evalkit_source_digest(root)
    if found != expected:
        raise DigestMismatch(
            f"{root}: EvalKit source digest mismatch\n  expected {expected} (evalkit.digest)\n  found    {found}\n"
            f"The checkout differs from the pinned one: restore it, or, if the change is intended, pin the new "
            f"digest in evalkit.digest (this starts a new run)."
        )
    return found


# The public VBVR-EvalKit's module-level imports besides the standard library (measured on its main branch at
# 275472f), by where they are made: a scorer process imports all of them before any evaluator runs, so an
# environment without one cannot start (without tqdm: ModuleNotFoundError at `import run_evaluation`). EasyOCR and
# norfair are imported where they are used, so they are the runtime contract's to check, not this list's. The
# runtime check imports each in every scorer process; envs/scorer.txt and envs/cpu.txt (whose interpreter runs the
# tiny default's stand-in EvalKit, which imports the same where the public one does) provide each.
EVALKIT_MODULE_IMPORTS = {
    "run_evaluation.py": ("numpy", "tqdm"),
    "vbvr_bench/evaluators/": ("cv2", "numpy"),
    "vbvr_bench/utils.py": ("PIL",),
}
EVALKIT_MODULES = tuple(sorted({module for modules in EVALKIT_MODULE_IMPORTS.values() for module in modules}))
"""Every module the public EvalKit imports at module level, once each."""

# Distribution name -> the module a scorer imports from it (the contract's packages that have one).
PROBE_MODULES = {
    "easyocr": "easyocr",
    "norfair": "norfair",
    "scipy": "scipy",
    "scikit-image": "skimage",
    "opencv-python": "cv2",
    "opencv-python-headless": "cv2",
    "numpy": "numpy",
    "pillow": "PIL",
    "imageio": "imageio",
    "av": "av",
    "tifffile": "tifffile",
}


def run_probe(contract: dict[str, str]) -> dict:
    """What this interpreter has of the contract (versions, imports, cv2's behaviour, easyocr's assets) and of the
    EvalKit's module-level imports (EVALKIT_MODULES). Run in a scorer process (`check_runtime` asks one; every
    worker runs it again in itself)."""
    from importlib import metadata

    found, imports, checks = {}, {}, {}
    evalkit_imports = {module: _import_finding(module) for module in EVALKIT_MODULES}
    for name in contract:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
        module = PROBE_MODULES.get(name)
        if module and module not in imports:
            imports[module] = _import_finding(module)
    if imports.get("cv2") == "ok":
        import cv2
        import numpy as np

        checks["cv2_version"] = cv2.__version__
        img = np.zeros((64, 64), np.uint8)
        cv2.line(img, (5, 5), (60, 60), 255, 2)
        lines = cv2.HoughLinesP(img, 1, np.pi / 180, 10, minLineLength=10, maxLineGap=2)
        checks["HoughLinesP_shape"] = None if lines is None else list(lines.shape)
    if imports.get("easyocr") == "ok":
        import os

        import easyocr

        en_char = os.path.join(os.path.dirname(easyocr.__file__), "character", "en_char.txt")
        checks["easyocr_en_char"] = en_char if os.path.isfile(en_char) else None
    return {
        "found": found,
        "imports": imports,
        "evalkit_imports": evalkit_imports,
        "checks": checks,
        "python": sys.version.split()[0],
    }


def _import_finding(module: str) -> str:
    """The finding of `import module` in this interpreter: "ok", or why it fails."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - any import failure is the finding
        return f"{type(err).__name__}: {err}"
    return "ok"


def runtime_problems(contract: dict[str, str], probe: dict) -> list[str]:
    """What the interpreter's packages, imports and behaviour break of the runtime contract."""
    problems = [
        f"{name}: contract {want}, found {probe['found'][name] or 'not installed'}"
        for name, want in sorted(contract.items())
        if probe["found"][name] != want
    ]
    problems += [f"import {module} fails: {why}" for module, why in sorted(probe["imports"].items()) if why != "ok"]
    for module, why in sorted(probe.get("evalkit_imports", {}).items()):
        if why != "ok":
            where = " and ".join(place for place, modules in EVALKIT_MODULE_IMPORTS.items() if module in modules)
            problems.append(
                f"import {module} fails ({why}): the public EvalKit imports {module} at module level ({where}), so "
                f"no scorer process can start without it; build the scorer environment with `make scorer-env` "
                f"(envs/scorer.txt lists it) and point evalkit.python at its interpreter"
            )
    checks = probe["checks"]
    opencv = contract.get("opencv-python") or contract.get("opencv-python-headless")
    if opencv and "cv2_version" in checks and not opencv.startswith(checks["cv2_version"]):
        problems.append(f"cv2.__version__ is {checks['cv2_version']}, the contract pins opencv {opencv}")
    shape = checks.get("HoughLinesP_shape")
    if "HoughLinesP_shape" in checks and not (isinstance(shape, list) and len(shape) == 3 and shape[1:] == [1, 4]):
        problems.append(f"cv2.HoughLinesP returned shape {shape}, the evaluators need (N, 1, 4)")
    if "easyocr_en_char" in checks and checks["easyocr_en_char"] is None:
        problems.append("easyocr's character/en_char.txt is missing from the installed easyocr package")
    return problems
