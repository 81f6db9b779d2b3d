"""The tiny default's evaluation tree: the synthetic generators' samples in the release layout."""

from __future__ import annotations

import json
from pathlib import Path

from videogrpo import atomic
from videogrpo.demo import synthetic_dataset
from videogrpo.evaluation.evalset import DOMAINS, MANIFEST, SAMPLE_FILES, EvalSetError


def write_synthetic_tree(
    root: Path, tasks: list[str], per_task: int, seed: int, frames: int, height: int, width: int, fps: int
) -> None:
    """A synthetic evaluation tree in the release layout: the last task is Out-of-Domain_50, the others
    In-Domain_50 (a manifest lists a task once), `per_task` fresh draws of each task's generator."""
    if len(tasks) < 2:
        raise EvalSetError(
            f"a synthetic evaluation tree needs two tasks (one per domain), the task list has {len(tasks)}"
        )
    records = []
    for task in tasks:
        domain = DOMAINS[1] if task == tasks[-1] else DOMAINS[0]
        bench = []
        for index in range(per_task):
            # Indices far from the training set's (0 .. samples_per_task): other draws of the generator.
            members = synthetic_dataset.sample_members(task, 10_000 + index, seed, frames, height, width, fps)
            sample_id = f"{task}_eval_{index:05d}"
            target = root / domain / task / f"{index:05d}"
            target.mkdir(parents=True, exist_ok=True)
            for member, data in members.items():
                leaf = member.rsplit("/", 1)[1]
                if leaf == "metadata.json":
                    data = json.dumps(dict(json.loads(data), task_id=sample_id), indent=2).encode()
                if leaf in SAMPLE_FILES:
                    atomic.write_bytes(target / leaf, data)
            bench.append(sample_id)
        records.append({"task": task, "split": domain, "bench": bench})
    atomic.write_json(root / MANIFEST, records)
