"""The materialized dataset as the trainer and evaluator see it: samples, splits, the training order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo.errors import ConfigError


# A dataset holds tens of thousands of samples: one slotted object each, sharing the raw/ Path (a Path per sample
# doubled the memory of loading the index and made it several times slower: bench/bench_data.py).
@dataclass(frozen=True, slots=True)
class SampleRef:
    task: str
    sample_id: str
    raw: Path
    """The dataset's raw/ directory, which holds `<task>/<sample_id>/`."""

    @property
    def directory(self) -> Path:
        return self.raw / self.task / self.sample_id

    @property
    def prompt(self) -> str:
        return (self.directory / "video/prompt.txt").read_text(encoding="utf-8").strip()

    @property
    def first_frame(self) -> Path:
        return self.directory / "first_frame.png"


def load_split(materialized: str | Path, split: str) -> list[SampleRef]:
    """Samples of one split (`rl` or `heldout`) in task-grouped order, as the split manifest lists them."""
    root = Path(materialized)
    dataset = json.loads((root / "dataset.json").read_text())
    raw = root / dataset["root"]
    refs = []
    for entry in json.loads((root / "splits.json").read_text()):
        refs += [SampleRef(entry["task"], sid, raw) for sid in entry[split]]
    return refs


def training_order(samples: list[SampleRef], shuffle_seed: int) -> list[SampleRef]:
    """Shuffle the task-grouped index once with a fixed seed, so tasks never arrive in sequence."""
    order = np.random.default_rng(shuffle_seed).permutation(len(samples))
    return [samples[i] for i in order]


def steps_per_epoch(num_samples: int, prompts_per_step: int) -> int:
    steps = num_samples // prompts_per_step
    if steps == 0:
        raise ConfigError(
            f"grpo.prompts_per_step = {prompts_per_step}: larger than the {num_samples} training "
            f"samples; lower it or add data"
        )
    return steps


def batch_for_step(order: list[SampleRef], prompts_per_step: int, step: int) -> tuple[int, list[SampleRef]]:
    """(epoch, prompts) of global update `step` (0-based); the last partial batch of an epoch is dropped."""
    per_epoch = steps_per_epoch(len(order), prompts_per_step)
    epoch, index = divmod(step, per_epoch)
    return epoch, order[index * prompts_per_step : (index + 1) * prompts_per_step]
