"""A run's one evaluation set, in the layout of the reference's release evaluation.

A flattened tree `<domain>/<task>/<index>/{first_frame.png, prompt.txt, ground_truth.mp4, metadata.json}`
with domains In-Domain_50 then Out-of-Domain_50, and `split_manifest.json` at its root: a list of
`{"task", "split", "bench": [sample ids]}` records, the sample id of `<task>/<index>` being bench[index]
(metadata.json's `task_id` must equal it). The evaluation list is the exact set the manifest names, in
domain, task, index order; a sample's position in it offsets its seed.

The tree is an external one (the release set, matrix.eval_set), or one built in that layout from the materialized
dataset's configured split (`write_dataset_tree`): every task of the dataset is a training task, so In-Domain_50.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from videogrpo import atomic
from videogrpo.data.dataset import SampleRef, load_split
from videogrpo.errors import ConfigError, DataError, DigestMismatch
from videogrpo.provenance.digest import sha256_file

DOMAINS = ("In-Domain_50", "Out-of-Domain_50")
SAMPLE_FILES = ("first_frame.png", "prompt.txt", "ground_truth.mp4", "metadata.json")
MANIFEST = "split_manifest.json"
INDEX = re.compile(r"^\d{5}$")
# A tree sample's files from a materialized dataset sample (data/materialize.py's layout); metadata.json apart.
DATASET_FILES = {
    "first_frame.png": "first_frame.png",
    "prompt.txt": "video/prompt.txt",
    "ground_truth.mp4": "video/ground_truth.mp4",
}
# The final frame a built set is scored against: the dataset's own, as the training reward reads it (an external
# tree has none: eval_set takes the last frame of its ground-truth video).
DATASET_FINAL_FRAME = "video/final_frame.png"


class EvalSetError(DataError):
    """The evaluation tree or its split manifest is not the exact set it must be."""


@dataclass(frozen=True)
class EvalSample:
    index: int
    """Position in the evaluation list: the sample's seed offset."""
    domain: str
    task: str
    sample: str
    """The sample's directory name, `00000`."""
    sample_id: str
    """bench[int(sample)] of its task in the split manifest (metadata.json's task_id)."""

    @property
    def name(self) -> str:
        """`<domain>/<task>/<index>`: the sample's directory in the tree and its video's path in a cell."""
        return f"{self.domain}/{self.task}/{self.sample}"

    def to_dict(self) -> dict:
        return asdict(self)


def read_split_manifest(root: Path) -> dict[str, tuple[str, list[str]]]:
    """task -> (domain, bench) of the records whose split is one of DOMAINS."""
    path = root / MANIFEST
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvalSetError(f"{path}: no split manifest; the evaluation tree must hold {MANIFEST}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EvalSetError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(records, list):
        raise EvalSetError(f"{path}: expected a list of {{task, split, bench}} records, found {type(records).__name__}")
    tasks: dict[str, tuple[str, list[str]]] = {}
    for position, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("task"), str):
            raise EvalSetError(f"{path}: record {position} has no task name")
        task = record["task"]
        if record.get("split") not in DOMAINS:
            continue
        if task in tasks:
            raise EvalSetError(f"{path}: task {task!r} is listed twice")
        bench = record.get("bench")
        if not isinstance(bench, list) or not bench or not all(isinstance(s, str) for s in bench):
            raise EvalSetError(f"{path}: task {task!r} has no bench list of sample ids")
        repeated = sorted({s for s in bench if bench.count(s) > 1})
        if repeated:
            raise EvalSetError(f"{path}: task {task!r} lists sample ids twice: {repeated[:5]}")
        tasks[task] = (record["split"], bench)
    return tasks


def eval_samples(root: Path, expected: int) -> list[EvalSample]:
    """The evaluation list of the tree at `root`, after checking it is exactly the manifest's set."""
    root = Path(root)
    tasks = read_split_manifest(root)
    samples: list[EvalSample] = []
    problems: list[str] = []
    for domain in DOMAINS:
        domain_dir = root / domain
        if not domain_dir.is_dir():
            continue
        for task_dir in sorted(domain_dir.iterdir()):
            task = task_dir.name
            if task not in tasks:
                problems.append(f"{domain}/{task}: task absent from {MANIFEST}")
                continue
            if tasks[task][0] != domain:
                problems.append(f"{domain}/{task}: the manifest assigns this task to {tasks[task][0]}")
                continue
            bench = tasks[task][1]
            for sample_dir in sorted(task_dir.iterdir()):
                where = f"{domain}/{task}/{sample_dir.name}"
                if not INDEX.match(sample_dir.name) or not sample_dir.is_dir():
                    problems.append(f"{where}: not a sample directory (five digits)")
                    continue
                if int(sample_dir.name) >= len(bench):
                    problems.append(f"{where}: index beyond the task's {len(bench)} bench samples")
                    continue
                missing = [f for f in SAMPLE_FILES if not (sample_dir / f).is_file()]
                if missing:
                    problems.append(f"{where}: missing {', '.join(missing)}")
                    continue
                expected_id = bench[int(sample_dir.name)]
                found_id = _task_id(sample_dir / "metadata.json")
                if found_id != expected_id:
                    problems.append(f"{where}: metadata.json task_id {found_id!r}, the manifest says {expected_id!r}")
                    continue
                samples.append(EvalSample(len(samples), domain, task, sample_dir.name, expected_id))
    present = {(s.task, int(s.sample)) for s in samples}
    for task, (domain, bench) in tasks.items():
        absent = [f"{domain}/{task}/{i:05d}" for i in range(len(bench)) if (task, i) not in present]
        problems += [f"{name}: listed in {MANIFEST} but not in the tree" for name in absent]
    if not problems and len(samples) != expected:
        problems.append(f"{len(samples)} samples, expected exactly {expected} (matrix.expected_samples)")
    if problems:
        shown = "\n  - ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise EvalSetError(f"{root}: the evaluation set is not the exact set of its split manifest:\n  - {shown}")
    return samples


def dataset_samples(dataset: Path, split: str, per_task: int | None) -> list[SampleRef]:
    """The first `per_task` samples of each task in the materialized dataset's `split` (task-grouped order, as the
    split manifest lists them; None: all)."""
    samples = load_split(dataset, split)
    if not samples:
        raise ConfigError(
            f"{dataset}: the {split!r} split is empty (matrix.split = {split!r}); hold samples out with "
            f"data.heldout_per_task, or evaluate the 'rl' split"
        )
    kept, seen = [], {}
    for sample in samples:
        seen[sample.task] = seen.get(sample.task, 0) + 1
        if per_task is None or seen[sample.task] <= per_task:
            kept.append(sample)
    return kept


def write_dataset_tree(root: Path, samples: list[SampleRef]) -> dict[str, SampleRef]:
    """The evaluation tree of dataset samples in the release layout, with its split manifest; returns each sample's
    name in the tree -> the dataset sample it was copied from.

    The files are the dataset's, copied; metadata.json gains `task_id` = the sample id, as the layout names each
    sample by it. A sample's index is its place among its task's samples."""
    by_task: dict[str, list[SampleRef]] = {}
    for sample in samples:
        by_task.setdefault(sample.task, []).append(sample)
    placed, records = {}, []
    for task, members in by_task.items():
        for index, sample in enumerate(members):
            name = f"{DOMAINS[0]}/{task}/{index:05d}"
            target = root / name
            target.mkdir(parents=True)
            source = sample.directory
            for leaf, relative in DATASET_FILES.items():
                atomic.write_bytes(target / leaf, (source / relative).read_bytes())
            metadata = json.loads((source / "metadata.json").read_text(encoding="utf-8"))
            atomic.write_json(target / "metadata.json", dict(metadata, task_id=sample.sample_id))
            placed[name] = sample
        records.append({"task": task, "split": DOMAINS[0], "bench": [s.sample_id for s in members]})
    atomic.write_json(root / MANIFEST, records)
    return placed


def _task_id(path: Path) -> str | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("task_id")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise EvalSetError(f"{path}: not a JSON object ({err})") from None
    return value if isinstance(value, str) else None


def last_frame(video: Path) -> np.ndarray:
    """The last frame of a ground-truth video (what the EvalKit compares a generated final frame with)."""
    from videogrpo.data.video import last_frame as decoded_last_frame

    return decoded_last_frame(video)


def changed_sample_files(path: Path, check: tuple[str, ...]) -> list[tuple[str, Path, str]]:
    """(sample name, file, SHA-256 recorded in samples.json) of each file named in `check` that is missing or
    differs from what eval_set recorded."""
    listed = json.loads(path.read_text())
    tree = Path(listed["tree"])
    changed = []
    for entry in listed["samples"]:
        for name in check:
            file = tree / entry["name"] / name
            if not file.is_file() or sha256_file(file) != entry["files"][name]:
                changed.append((entry["name"], file, entry["files"][name]))
    return changed


def _refusal(path: Path, changed: list[tuple[str, Path, str]], note: str = "") -> DigestMismatch:
    _, file, recorded = changed[0]
    found = sha256_file(file) if file.is_file() else "missing"
    more = f" (and {len(changed) - 1} more files)" if len(changed) > 1 else ""
    return DigestMismatch(
        f"{file}: changed since eval_set recorded it (SHA-256 {recorded} in {path}, found {found}){more}{note}; "
        f"restore the evaluation tree, or rerun eval_set (snakemake --forcerun eval_set)"
    )


def load_samples(path: Path, check: tuple[str, ...] = ()) -> tuple[Path, list[EvalSample]]:
    """The evaluation tree and list of samples.json; the files named in `check` must still have their recorded
    SHA-256 (the tree is read in place, after eval_set pinned it)."""
    if check and (changed := changed_sample_files(path, check)):
        raise _refusal(path, changed)
    listed = json.loads(path.read_text())
    samples = [
        EvalSample(**{k: entry[k] for k in ("index", "domain", "task", "sample", "sample_id")})
        for entry in listed["samples"]
    ]
    return Path(listed["tree"]), samples


def recheck_samples(path: Path, check: tuple[str, ...], made_from: Callable[[str], list[Path]]) -> None:
    """The files in `check` again, after a stage read them while it ran: what it made from a file changed
    meanwhile (`made_from(sample name)`, in its resume work) is deleted and the stage refused, so that no
    result of the edited file survives, whether the file is restored or the evaluation set pinned again."""
    changed = changed_sample_files(path, check)
    if not changed:
        return
    for name in sorted({name for name, _, _ in changed}):
        for made in made_from(name):
            made.unlink(missing_ok=True)
    raise _refusal(path, changed, note=", while this stage ran: what it made from the sample was discarded")
