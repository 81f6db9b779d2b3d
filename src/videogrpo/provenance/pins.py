"""The external inputs a run pinned by digest, checked again by `videogrpo verify`.

Not every input is a stage's output: the EvalKit checkout (evalkit.digest), the judge's rubric and protocol
files (reward.judge_prompts_digest, reward.judge_protocol_digest) and an external evaluation tree
(matrix.eval_set_digest) live outside results/, pinned in config. Stages check them when they read them;
an edit made later, or one that keeps the file's time (Snakemake then sees nothing), shows only here.

The pins come from the config the run's stages recorded (each manifest's params), so verify needs no
config file and checks exactly what the run used: the EvalKit a fingerprint_evalkit stage pinned (the rule
reward, and evaluation whatever the reward), the judge files of a vbvr_vlm run, the tree of an eval_set run
on matrix.eval_set. Relative paths are read from the workflow directory, as the stages read them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from videogrpo.config import kinds_in
from videogrpo.provenance import digest


def _params(manifest: dict[str, Any], section: str) -> dict[str, Any]:
    value = manifest.get("params", {}).get(section)
    return value if isinstance(value, dict) else {}


def _kinds(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The reward kinds the stage's run scored with (reward.terms' kinds, or reward.kind, and its gold rewards), from
    its params."""
    reward = _params(manifest, "reward")
    return kinds_in(reward.get("kind", ""), reward.get("terms"), _params(manifest, "train").get("validate_rewards"))


def _checkout(path: str, moved_to: str | None) -> Path:
    """The checkout a pin names: where the run recorded it or, when it is no longer there, where the run's config
    now puts it (evalkit.path is an execution field: a moved copy is the same EvalKit while its digest holds)."""
    root = Path(path)
    if not (root / "run_evaluation.py").is_file() and moved_to and (Path(moved_to) / "run_evaluation.py").is_file():
        return Path(moved_to)
    return root


def evalkit_problems(manifests: dict[Path, dict[str, Any]], moved_to: str | None = None) -> tuple[int, list[str]]:
    """Each EvalKit checkout the run pinned against its evalkit.digest; the files that differ from the listing
    fingerprint_evalkit recorded are named. `moved_to`: evalkit.path as the run's config says now."""
    pins: dict[tuple[str, str], dict[str, str]] = {}
    ocr_weights: dict[str, str] = {}  # the EasyOCR weights folder -> the tree digest fingerprint_evalkit recorded
    for manifest in manifests.values():
        evalkit = _params(manifest, "evalkit")
        fingerprinted = manifest["stage"] == "fingerprint_evalkit"
        if not (fingerprinted or "vbvr_rule" in _kinds(manifest)):
            continue
        if not evalkit.get("path"):
            continue
        root = _checkout(evalkit["path"], moved_to)  # a checkout recorded at two places since it moved: once
        listing = pins.setdefault((str(root), evalkit.get("digest", "")), {})
        record = manifest["outputs"].get("fingerprint") if fingerprinted else None
        if record and Path(record["path"]).is_file():
            fingerprint = json.loads(Path(record["path"]).read_text())
            listing.update(fingerprint.get("listing", {}))
            if "easyocr_models_tree_sha256" in fingerprint:
                # Relative to the checkout (an absolute folder stays where it is).
                models = root / fingerprint.get("easyocr_models", "easyocr_models")
                ocr_weights[str(models)] = fingerprint["easyocr_models_tree_sha256"]
    checked, problems = 0, []
    for models, recorded_tree in sorted(ocr_weights.items()):
        checked += 1
        found = digest.tree_digest(Path(models)) if Path(models).is_dir() else "no such directory"
        if found != recorded_tree:
            problems.append(
                f"CHANGED {models}/ (the EasyOCR weights the evaluators read, evalkit.easyocr_models): "
                f"fingerprint_evalkit recorded tree {recorded_tree}, found {found}"
            )
    for (path, pinned), recorded in sorted(pins.items()):
        root = Path(path)
        if not (root / "run_evaluation.py").is_file():
            problems.append(f"MISSING {root}/run_evaluation.py (evalkit.path, pinned by evalkit.digest {pinned})")
            continue
        files = digest.evalkit_files(root)
        checked += len(files)
        found = digest.digest_length_prefixed(root, files)
        if found == pinned:
            continue
        current = {rel: digest.sha256_file(root / rel) for rel in files} if recorded else {}
        differ = [
            ("MISSING" if rel not in current else "ADDED  " if rel not in recorded else "CHANGED", rel)
            for rel in sorted(set(current) | set(recorded))
            if current.get(rel) != recorded.get(rel)
        ]
        where = f"(evalkit.digest): EvalKit source digest pinned {pinned}, found {found}"
        if not differ:  # no listing recorded to compare with: the checkout as a whole
            problems.append(f"CHANGED {root}/ {where}")
        for tag, rel in differ:
            change = f"; fingerprint_evalkit recorded {recorded[rel]}" if tag == "CHANGED" else ""
            problems.append(f"{tag} {root / rel} {where}{change}")
    return checked, problems


# The judge's pinned files: (path field, digest field) of the reward section.
JUDGE_FILES = (
    ("judge_prompts", "judge_prompts_digest"),
    ("judge_protocol", "judge_protocol_digest"),
)


def judge_problems(manifests: dict[Path, dict[str, Any]]) -> tuple[int, list[str]]:
    """The rubric and protocol files of a vbvr_vlm run against their plain SHA-256 pins."""
    pins: set[tuple[str, str, str]] = set()
    for manifest in manifests.values():
        reward = _params(manifest, "reward")
        if "vbvr_vlm" not in _kinds(manifest):
            continue
        for path_field, digest_field in JUDGE_FILES:
            if reward.get(path_field):
                pins.add((path_field, reward[path_field], reward.get(digest_field, "")))
    checked, problems = 0, []
    for path_field, path, pinned in sorted(pins):
        field = f"reward.{path_field}_digest"
        if not Path(path).is_file():
            problems.append(f"MISSING {path} (reward.{path_field}, pinned by {field} {pinned})")
            continue
        checked += 1
        if (found := digest.sha256_file(path)) != pinned:
            problems.append(f"CHANGED {path} ({field}): pinned {pinned}, found {found}")
    return checked, problems


def eval_tree_problems(manifests: dict[Path, dict[str, Any]]) -> tuple[int, list[str]]:
    """An external evaluation tree (matrix.eval_set) against matrix.eval_set_digest, and each sample file
    against the SHA-256 eval_set recorded in samples.json (what generate_cell and score_cell re-check)."""
    checked, problems = 0, []
    seen: set[tuple[str, str]] = set()
    for manifest in manifests.values():
        matrix = _params(manifest, "matrix")
        if manifest["stage"] != "eval_set" or not matrix.get("eval_set"):
            continue
        root, pinned = Path(matrix["eval_set"]), matrix.get("eval_set_digest", "")
        if (str(root), pinned) in seen:
            continue
        seen.add((str(root), pinned))
        if not root.is_dir():
            problems.append(f"MISSING {root}/ (matrix.eval_set, pinned by matrix.eval_set_digest {pinned})")
            continue
        entries = digest.tree_entries(root)
        checked += len(entries)
        if (found := digest.tree_digest_of_entries(entries)) != pinned:
            problems.append(f"CHANGED {root}/ (matrix.eval_set_digest): pinned {pinned}, found {found}")
        samples = Path(manifest["outputs"]["samples"]["path"])
        if not samples.is_file():
            continue  # verify's output check reports it missing
        where = f"(matrix.eval_set sample, SHA-256 recorded in {samples})"
        for entry in json.loads(samples.read_text())["samples"]:
            for name, recorded in sorted(entry["files"].items()):
                rel = f"{entry['name']}/{name}"
                if rel not in entries:
                    problems.append(f"MISSING {root / rel} {where}: recorded {recorded}")
                elif entries[rel][0] != recorded:
                    problems.append(f"CHANGED {root / rel} {where}: recorded {recorded}, found {entries[rel][0]}")
    return checked, problems


def pin_problems(manifests: dict[Path, dict[str, Any]], evalkit_now: str | None = None) -> tuple[int, list[str]]:
    """Files checked and problems found over every external pin the run's manifests record; `evalkit_now`:
    evalkit.path as the run's config says now, where a checkout moved since a stage ran is looked for."""
    checked, problems = 0, []
    for n, found in (
        evalkit_problems(manifests, evalkit_now),
        judge_problems(manifests),
        eval_tree_problems(manifests),
    ):
        checked += n
        problems += found
    return checked, problems
