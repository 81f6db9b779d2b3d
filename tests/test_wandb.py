"""W&B as a tracker, offline (no network), read back from the run file it writes: each update and validation point
once in a run resumed after an attempt that stopped during a validation.

W&B offline has no server to resume from, so the test stands in for one: a resumed online run starts with the
rows its server holds (its step one past the last, its summary their last values), and the test's `wandb.init`
replays the earlier attempt's rows, read from that attempt's run file, into the new run before the Tracker uses
it, which leaves the new run in that state."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from videogrpo import config
from videogrpo.grpo.tracking import Tracker

from harness import validation_point

RUN_ID = "test"
BLOCK, HEADER = 32768, 7
"""The run file's framing (LevelDB's log format, as W&B writes it): 32 KiB blocks of records, each with a
7-byte header (CRC, length, kind: 1 whole, 2 first part, 3 middle, 4 last), after a 7-byte file header."""


def records(path: Path) -> list:
    """The protobuf records of a finished W&B run file (`run-<id>.wandb`). W&B's service process writes the file and
    may still be writing it when `finish()` returns: it is complete once its exit record is in it."""
    deadline = time.monotonic() + 60
    while True:
        found = _records(path.read_bytes())
        if any(record.WhichOneof("record_type") == "exit" for record in found):
            return found
        assert time.monotonic() < deadline, f"{path} has no exit record after 60 s"
        time.sleep(0.1)


def _records(data: bytes) -> list:
    from wandb.proto import wandb_internal_pb2

    found, pos, parts = [], HEADER, b""
    while data.startswith(b":W&B") and pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER]) if room >= HEADER else (0, 0, 0)
        if kind == 0:  # a block's zero padding
            pos += room
            continue
        if pos + HEADER + length > len(data):  # still being written
            break
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        parts = body if kind in (1, 2) else parts + body
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            found.append(record)
    return found


def rows(folder: Path) -> list[dict]:
    """The history rows of an offline run folder, in order, with their values."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in records(folder / f"run-{RUN_ID}.wandb")
        if record.WhichOneof("record_type") == "history"
    ]


def folders(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{RUN_ID}"))


@pytest.fixture
def resuming_init(monkeypatch):
    """wandb.init as an online resume would leave the run: the earlier attempts' rows in it, at their steps."""
    import wandb

    real_init = wandb.init

    def init(**kwargs):
        earlier = folders(Path(kwargs["dir"]))
        run = real_init(**kwargs)
        for folder in earlier:
            for row in rows(folder):
                run.log({k: v for k, v in row.items() if not k.startswith("_")}, step=row["_step"], commit=True)
        return run

    monkeypatch.setattr(wandb, "init", init)


def update(step: int) -> dict:
    reward = step / 10
    return {
        "step": step,
        "reward_mean": reward,
        "reward_std": 0.1,
        "reward_per_task": {"task_a": reward},
        "policy_loss": 0.0,
        "ppo_ratio_mean": 1.0,
        "delayed_replay_staleness": 0.0,
        "time_step_s": 1.0,
    }


def point(step: int) -> dict:
    return validation_point(step, 0.5 + step / 100, gold=0.3 - step / 100)  # with a gold reward


def test_a_validation_point_redone_after_a_resume_reaches_wandb_once(resuming_init, tmp_path):
    """validate_every 1, a checkpoint at update 2. The first attempt stops with an error during the validation
    after update 3 (its finish sends update 3's row); the second resumes from update 2's checkpoint, redoes update 3
    and its validation and goes on to update 4. W&B must then hold every update and every point once, the redone
    point at 3 included, which W&B drops when it is logged at a step below the resumed run's."""
    cfg = config.from_dict({"logging": {"tracker": ["wandb"], "wandb_mode": "offline"}}, partial=True)
    metrics_file = tmp_path / "metrics.jsonl"

    first = Tracker(metrics_file, 4, cfg.logging, RUN_ID, tmp_path, {}, enabled=True)
    first.record_validation(point(0))
    for step in (1, 2):
        first.record(update(step))
        first.record_validation(point(step))
    first.record(update(3))
    first.close()

    resumed = Tracker(metrics_file, 4, cfg.logging, RUN_ID, tmp_path, {}, enabled=True)
    resumed.trim(2)
    resumed.record(update(3))
    resumed.record_validation(point(3))
    resumed.record(update(4))
    resumed.record_validation(point(4))
    resumed.close()

    first_folder, second_folder = folders(tmp_path)
    held = rows(second_folder)  # the resumed run: what the server held, and what the second attempt sent
    assert [(r["step"], r["reward_mean"]) for r in held if "reward_mean" in r] == [(k, k / 10) for k in (1, 2, 3, 4)]
    assert [r["reward/task_a"] for r in held if "reward/task_a" in r] == [k / 10 for k in (1, 2, 3, 4)]
    assert [r["val/reward_mean"] for r in held if "val/reward_mean" in r] == [0.5 + k / 100 for k in range(5)]
    assert [r["val/reward/task_a"] for r in held if "val/reward/task_a" in r] == [0.5 + k / 100 for k in range(5)]
    assert [r["val/step"] for r in held if "val/reward_mean" in r] == [0, 1, 2, 3, 4]  # the points' x-axis
    gold = [r["val/vbvr_vlm/reward/task_a"] for r in held if "val/reward_mean" in r]  # a gold reward's, per task
    assert gold == [0.3 - k / 100 for k in range(5)]
    # The first attempt's own file: what it sent before it stopped.
    assert [r["val/reward_mean"] for r in rows(first_folder) if "val/reward_mean" in r] == [0.5, 0.51, 0.52]
    assert [m["step"] for m in map(json.loads, metrics_file.read_text().splitlines())] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
