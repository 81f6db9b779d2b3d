"""`videogrpo verify` and `videogrpo diff`: a run's recorded digests checked again, and two runs compared.

verify starts from the manifests in a run directory, follows each manifest's upstream manifests (the
shared downloads, dataset and EvalKit records), re-hashes every output they name and lists what
changed, is missing or was added; then it checks the external inputs the run pinned in its config (the
EvalKit checkout, the judge's rubric and protocol files, an external evaluation tree: `pins`). diff
compares two runs' config fields (by class), output digests and final metrics, and shows their cost.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from videogrpo.errors import VideoGRPOError
from videogrpo.progress import Progress
from videogrpo.provenance import digest, pins, trace
from videogrpo.provenance.manifest import read_manifest
from videogrpo.provenance.metric_rows import VALIDATION_PREFIX, training_rows, validation_rows
from videogrpo.provenance.rebuild import rebuild_hint, run_config, run_status, stage_list

VALIDATION_TIME = VALIDATION_PREFIX + "time_s"


def run_manifests(
    run_dir: Path, unreadable: list[str] | None = None, expected: list[Path] = ()
) -> dict[Path, dict[str, Any]]:
    """The manifests of a run directory, the `expected` ones, and, transitively, every upstream manifest they
    name. A manifest that is missing or unreadable raises, or with `unreadable` given is listed there (each
    message names the stage and the command that rebuilds this run) and skipped."""
    todo = sorted(run_dir.glob("*.manifest.json"))
    if not todo:
        raise VideoGRPOError(f"{run_dir}: no stage manifests here; give a run directory (results/runs/<run>)")
    todo = [*expected, *todo]  # a stack: the run's own first, then what they name, then the expected rest
    found: dict[Path, dict[str, Any]] = {}
    seen: set[str] = set()  # by absolute path: a manifest named in two spellings is read once
    rebuild = rebuild_hint(run_dir)
    while todo:
        path = todo.pop()
        if (key := os.path.abspath(path)) in seen:
            continue
        seen.add(key)
        try:
            found[path] = read_manifest(path, rebuild)
        except VideoGRPOError as err:
            if unreadable is None:
                raise
            unreadable.append(f"{'MISSING' if not path.exists() else 'CHANGED'} {err}")
            continue
        todo += [Path(p) for p in found[path].get("upstream", [])]
    return found


def named_manifests(run_dir: Path, partial: bool = False) -> dict[str, dict[str, Any]]:
    """The manifests of a run and of the stages it used (run_manifests), named as the report names
    them: the workflow's stage list where it has the manifest, else the stage, and `<stage>:<model>:<sampler>`
    (the two folders above it) for a stage with several manifests (the matrix cells). `partial`: those that are
    there, for an incomplete run; otherwise a missing one raises."""
    listed = stage_list(run_dir.parent.parent, run_dir.name)
    names = {}
    if listed.is_file():
        names = {os.path.abspath(path): name for name, path in json.loads(listed.read_text()).items()}
    manifests = run_manifests(run_dir, [] if partial else None)
    repeated = Counter(m["stage"] for p, m in manifests.items() if os.path.abspath(p) not in names)
    found: dict[str, dict[str, Any]] = {}
    for path, manifest in sorted(manifests.items()):
        name = names.get(os.path.abspath(path), manifest["stage"])
        if os.path.abspath(path) not in names and repeated[name] > 1:
            name = f"{manifest['stage']}:{path.parent.parent.name}:{path.parent.name}"
        found[name] = manifest
    return found


def run_rows(run_dir: Path, sacct: bool = True, partial: bool = False) -> list[dict[str, Any]]:
    """The trace of a run directory (`videogrpo trace`): a row per stage job (provenance/trace.py)."""
    return trace.rows_of(named_manifests(run_dir, partial), sacct)


@dataclass
class Verification:
    checked: int = 0
    problems: list[str] = field(default_factory=list)


def verify_run(run_dir: Path, log=print) -> Verification:
    """Re-hash every output the run's manifests record, and every external input they pin; a problem per
    changed, missing or added file."""
    result = Verification()
    # The workflow's list of the run's stages: a missing manifest nothing left refers to is named too.
    listed = stage_list(run_dir.parent.parent, run_dir.name)  # results/runs/<run> -> results/
    expected = [Path(p) for p in json.loads(listed.read_text()).values()] if listed.is_file() else []
    manifests = run_manifests(run_dir, result.problems, expected)
    progress = Progress("verify", total=len(manifests), unit="manifests")
    made_again: list[str] = []  # what to force: a stage whose output changed or vanished is not rerun by itself
    per_stage = Counter(manifest["stage"] for manifest in manifests.values())
    for path, manifest in sorted(manifests.items()):
        before = len(result.problems)
        result.checked += _check_outputs(manifest, result.problems)
        if len(result.problems) > before:
            # A stage of several jobs (the matrix cells) is forced by the one job's manifest, a file it makes.
            target = manifest["stage"] if per_stage[manifest["stage"]] == 1 else str(path)
            made_again += [] if target in made_again else [target]
        progress.update()
    progress.finish()
    now = run_config(run_dir)
    checked, problems = pins.pin_problems(manifests, now.evalkit.path if now is not None else None)
    result.checked += checked
    result.problems += problems
    for line in result.problems:
        log(line)
    log(f"{len(manifests)} manifests, {result.checked} files checked, {len(result.problems)} problems")
    if made_again:
        log(f"rebuild what changed or is missing with {rebuild_hint(run_dir, made_again)}")
    if (status := run_status(run_dir)) is not None:  # last: what a person reads first after a long list
        log(status)
    return result


def _check_outputs(manifest: dict[str, Any], problems: list[str]) -> int:
    """Re-hash a manifest's outputs, adding a line per changed, missing or added file to `problems`; returns how
    many files were checked."""
    checked = 0
    for name, record in sorted(manifest["outputs"].items()):
        where = f"{manifest['stage']} output {name}"
        target = Path(record["path"])
        if record["kind"] == "file":
            checked += 1
            if not target.is_file():
                problems.append(f"MISSING {target} ({where})")
            elif (found := digest.sha256_file(target)) != record["sha256"]:
                problems.append(f"CHANGED {target} ({where}): recorded {record['sha256']}, found {found}")
            continue
        if not target.is_dir():
            problems.append(f"MISSING {target}/ ({where})")
            continue
        recorded = record.get("entries", {})
        current = digest.tree_entries(target)
        checked += len(current)
        for rel in sorted(set(recorded) | set(current)):
            if rel not in current:
                problems.append(f"MISSING {target / rel} ({where})")
            elif rel not in recorded:
                problems.append(f"ADDED   {target / rel} ({where})")
            elif list(current[rel]) != list(recorded[rel]):
                problems.append(
                    f"CHANGED {target / rel} ({where}): recorded {recorded[rel][0]}, found {current[rel][0]}"
                )
    return checked


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def _final_metrics(run_dir: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    metrics = run_dir / "train/metrics.jsonl"
    if metrics.is_file() and (lines := metrics.read_text().splitlines()):
        rows = [json.loads(line) for line in lines if line]
        if trained := training_rows(rows):  # the last update's
            last = trained[-1]
            found.update(
                {f"train.{k}": v for k, v in last.items() if isinstance(v, (int, float)) and not k.startswith("time_")}
            )
        if validated := validation_rows(rows):  # with validation during training, the last point's val/* keys
            last = validated[-1]
            found.update(
                {
                    f"train.{k}": v
                    for k, v in last.items()
                    if isinstance(v, (int, float)) and k.startswith(VALIDATION_PREFIX) and k != VALIDATION_TIME
                }
            )
    table = run_dir / "matrix/per_task.csv"
    if table.is_file():  # each cell over all its samples, the held-out check's among them
        with open(table, newline="") as f:
            for row in csv.DictReader(f):
                if row["task"] == "ALL":
                    cell = f"matrix.{row['model']}:{row['sampler']}"
                    found.update({f"{cell}.{k}": v for k, v in row.items() if k not in ("model", "sampler", "task")})
    return found


def _config_fields(side: dict[Path, dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The config fields a run records: its train stage's view (every field of a run's identity), or, for a run
    without a train manifest, those of the stages it has (each records its own view); and whether it trained."""
    train = next((m["params"] for m in side.values() if m["stage"] == "train"), None)
    if train is not None:
        return _flatten(train), True
    found: dict[str, Any] = {}
    for manifest in side.values():
        found.update(_flatten(manifest.get("params") or {}))
    return found, False


def diff_runs(run_a: Path, run_b: Path, log=print) -> int:
    """Print the config fields (with their class), output digests and final metrics that differ; 1 if any. Then
    the cost change (provenance/trace.py), which does not count."""
    from videogrpo.config import field_class

    # First, before a long list of differences: a run that has no report differs by what it lacks.
    for label, run in (("run a", run_a), ("run b", run_b)):
        log(f"{label}: {run_status(run) or f'{run}: complete'}")
    unreadable: list[list[str]] = [[], []]  # an incomplete run's missing manifests: its status line says so
    sides = [run_manifests(run, unreadable[i]) for i, run in enumerate((run_a, run_b))]
    for label, run, lines in zip(("run a", "run b"), (run_a, run_b), unreadable):
        if lines and run_status(run) is None:
            log(f"{label}: {len(lines)} manifest(s) missing or unreadable: {lines[0]}")
    params = [_config_fields(side) for side in sides]
    if not all(trained for _, trained in params):
        # A run without its train manifest records only the fields of the stages it got to: comparing the train
        # view with those would list every field it lacks as a difference.
        shared = set(params[0][0]) & set(params[1][0])
        left_out = len(set(params[0][0]) | set(params[1][0])) - len(shared)
        lacking = " and ".join(label for label, (_, trained) in zip(("run a", "run b"), params) if not trained)
        log(
            f"config: {lacking} has no train manifest: compared over the {len(shared)} fields both runs record "
            f"({left_out} recorded by one run only are left out)"
        )
        params = [({k: v for k, v in fields.items() if k in shared}, trained) for fields, trained in params]
    params = [fields for fields, _ in params]
    outputs = [
        {
            f"{m['stage']}.{name}": rec.get("sha256") or rec.get("tree_sha256")
            for m in side.values()
            for name, rec in m["outputs"].items()
        }
        for side in sides
    ]
    metrics = [_final_metrics(run) for run in (run_a, run_b)]
    differences = 0
    for title, (a, b), label in (
        ("config", params, lambda k: f"{k} ({field_class(k)})"),
        ("digests", outputs, str),
        ("final metrics", metrics, str),
    ):
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        log(f"{title}: {len(keys)} differ" + (":" if keys else ""))
        for key in keys:
            log(f"  {label(key)}: {a.get(key, '-')}  |  {b.get(key, '-')}")
        differences += len(keys)
    # Shown, never counted: two runs' times always differ, and diff(1)'s exit status says whether they do.
    log("cost (run a | run b; times always differ, so not counted as a difference):")
    for line in trace.cost_lines(*(run_rows(run, sacct=False, partial=True) for run in (run_a, run_b))):
        log(line)
    return 1 if differences else 0
