"""Fingerprints of the EvalKit: its source digest (REFERENCE section 3) and its scorer runtime."""

from __future__ import annotations

import json
import subprocess
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
            f"(run_evaluation.py, vbvr_bench/, annotations/) whose source digest is evalkit.digest"
        )
    return root


def fingerprint(path: str | Path, expected: str) -> dict:
    """Compute the source digest of an EvalKit checkout and compare it with the pinned one."""
    root = check_checkout(path)
    files = digest.evalkit_files(root)
    found = digest.digest_length_prefixed(root, files)
    record = {
        "path": str(root),
        "source_sha256": found,
        "expected_sha256": expected,
        "files": len(files),
        "listing": {rel: digest.sha256_file(root / rel) for rel in files},
    }
    if uses_easyocr(root, files):
        models = root / "easyocr_models"
        if not (models / "en_char.txt").is_file():
            raise VideoGRPOError(
                f"{root}: the evaluators use easyocr.Reader but {models}/en_char.txt is missing; "
                f"place the EasyOCR model directory there"
            )
        record["easyocr_models_tree_sha256"] = digest.tree_digest(models)
    if found != expected:
        raise DigestMismatch(
            f"{root}: EvalKit source digest mismatch\n  expected {expected} (evalkit.digest)\n  found    {found}\n"
            f"The checkout differs from the pinned one: restore it, or, if the change is intended, pin the new "
            f"digest in evalkit.digest (this starts a new run)."
        )
    return record


_PROBE = r"""
import json, sys
from importlib import metadata
contract = json.loads(sys.argv[1])
found = {}
for name in contract:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = None
checks = {}
if any(n.startswith("opencv") for n in contract):
    try:
        import cv2, numpy as np
        img = np.zeros((64, 64), np.uint8); cv2.line(img, (5, 5), (60, 60), 255, 2)
        lines = cv2.HoughLinesP(img, 1, np.pi / 180, 10, minLineLength=10, maxLineGap=2)
        checks["HoughLinesP_shape"] = None if lines is None else list(lines.shape)
    except Exception as err:
        checks["HoughLinesP_shape"] = f"error: {err}"
print(json.dumps({"found": found, "checks": checks, "python": sys.version.split()[0]}))
"""


def check_runtime(contract: dict[str, str], python: str | None = None) -> dict:
    """Versions the scorer interpreter sees against the contract; the fingerprint covers both."""
    python = python or sys.executable
    out = subprocess.run([python, "-c", _PROBE, json.dumps(contract)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise VideoGRPOError(f"scorer runtime probe with {python} failed:\n{out.stderr}")
    probe = json.loads(out.stdout)
    problems = [
        f"{name}: contract {want}, found {probe['found'][name] or 'not installed'}"
        for name, want in sorted(contract.items())
        if probe["found"][name] != want
    ]
    shape = probe["checks"].get("HoughLinesP_shape")
    if "HoughLinesP_shape" in probe["checks"] and not (
        isinstance(shape, list) and len(shape) == 3 and shape[1:] == [1, 4]
    ):
        problems.append(f"cv2.HoughLinesP returned shape {shape}, the evaluators need (N, 1, 4)")
    canonical = json.dumps(
        {"contract": contract, "found": probe["found"], "checks": probe["checks"]},
        sort_keys=True,
        separators=(",", ":"),
    )
    record = {
        "python": python,
        "python_version": probe["python"],
        "contract": contract,
        "found": probe["found"],
        "checks": probe["checks"],
        "fingerprint": digest.sha256_bytes(canonical.encode()),
    }
    if problems:
        raise VideoGRPOError(
            "scorer runtime breaks evalkit.runtime:\n  "
            + "\n  ".join(problems)
            + f"\nInstall the pinned versions into the scorer environment ({python}) or fix the contract."
        )
    return record
