"""A full disk, wherever a stage meets it: the last thing the job prints, in the log Snakemake shows of it, is the
one line that names the file and the fix; never a library's traceback cut short where the disk ran out."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from videogrpo.data.video import write_mp4
from videogrpo.demo.synthetic_eval_tree import write_synthetic_tree
from videogrpo.errors import disk_full_message
from videogrpo.evaluation.evalset import load_samples
from videogrpo.provenance.digest import evalkit_source_digest, tree_digest

from conftest import TASKS

BIN = Path(sys.executable).parent
MATRIX = {"expected_samples": 6, "num_frames": 17, "height": 64, "width": 64, "seed": 0}
GENERATION = {"grpo": {"sampling_steps": 4}, "video": {"fps": 16}}  # where the matrix reads steps and fps
EVALKIT = {"workers": 2, "threads_per_worker": 1, "video_size": 128, "max_seconds": 5.0625, "runtime": []}


def stage_argv(name: str, sections: dict, *args: str) -> list[str]:
    return [str(BIN / "videogrpo"), "stage", name, "--config-json", json.dumps(sections), *args]


def leave_free(disk: Path, room: int) -> None:
    """Fill `disk` but for about `room` bytes."""
    stat = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - room))


@pytest.fixture
def cell_inputs(tmp_path) -> tuple[Path, Path]:
    """An evaluation set (eval_set on a synthetic tree) and a cell's videos of it: (eval_set's out, videos)."""
    tree = tmp_path / "tree"
    write_synthetic_tree(tree, TASKS, 2, seed=0, frames=17, height=64, width=64, fps=16)
    out = tmp_path / "evalset"
    sections = {"matrix": dict(MATRIX, eval_set=str(tree), eval_set_digest=tree_digest(tree)), **GENERATION}
    argv = stage_argv("eval-set", sections, "--tree", str(tree), "--samples", str(out / "samples.json"))
    argv += ["--final-frames", str(out / "final_frames"), "--manifest", str(out / "eval_set.manifest.json")]
    subprocess.run(argv, check=True, capture_output=True)
    videos = tmp_path / "videos"
    rng = np.random.default_rng(0)
    for sample in load_samples(out / "samples.json")[1]:
        (videos / sample.name).parent.mkdir(parents=True, exist_ok=True)
        write_mp4(videos / f"{sample.name}.mp4", rng.integers(0, 255, (17, 64, 64, 3), dtype=np.uint8), fps=16)
    return out, videos


def test_score_cell_on_a_full_disk_ends_its_log_with_the_file_and_the_fix(small_disk, cell_inputs, evalkit):
    """The scorer's PyAV writes fail with ENOSPC: that is no sample's error (no traceback per sample, no
    `scored 0.0` warning), the stage stops at once, and its log, on the full disk as the rule keeps it, ends with
    the line that names the file and the fix."""
    evalset, videos = cell_inputs
    cell = small_disk / "cell"
    cell.mkdir()
    sections = {"evalkit": dict(EVALKIT, digest=evalkit_source_digest(evalkit)), "matrix": MATRIX, **GENERATION}
    argv = stage_argv(
        "score-cell",
        sections,
        *("--videos", str(videos), "--samples", str(evalset / "samples.json")),
        *("--final-frames", str(evalset / "final_frames"), "--evalkit", str(evalkit)),
        *("--scores", str(cell / "scores.csv"), "--aggregate", str(cell / "aggregate.csv")),
        *("--prepared", str(cell / "prepared"), "--work", str(cell / "work"), "--manifest", str(cell / "m.json")),
    )
    log = cell / "score_cell.log"
    leave_free(small_disk, 96 * 1024)  # room for the log's first lines and less than one prepared video
    with open(log, "wb") as sink:  # `> {log} 2>&1`, as the rule runs it
        done = subprocess.run(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONWARNINGS="ignore")
        )
    text = log.read_text()
    assert done.returncode == 2, text
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"error: no space left on device writing {cell}/"), text
    assert "free space on that file system, or point `results` at a larger one" in last and "then rerun" in last
    assert "Traceback" not in text and "scored" not in text, text
    assert not (cell / "scores.csv").exists() and not list(small_disk.glob("cell/.*.reserve"))


def test_a_write_that_names_no_file_is_named_by_its_atomic_target(small_disk):
    """write() on a full disk raises ENOSPC without a file name: the atomic writer adds the file it was writing."""
    from videogrpo import atomic

    target = small_disk / "records" / "a.json"
    with pytest.raises(OSError) as err:
        atomic.write_bytes(target, b"x" * 1024 * 1024)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert disk_full_message(err.value).startswith(f"no space left on device writing {target} (")
    assert not target.exists() and list(target.parent.iterdir()) == []
    # A library's own write names no file: the caller names the directory it was writing under.
    bare = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full_message(bare, near=small_disk).startswith(f"no space left on device writing under {small_disk} (")


def test_a_checkpoint_write_that_fills_the_disk_is_said_as_a_full_disk(tmp_path, monkeypatch):
    """torch's checkpoint writer gathers each rank's failure into a CheckpointException, whose traceback dump
    would be all the log shows: the save raises the OSError, which the worker says in one line."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException

    from videogrpo.grpo import checkpoint

    def full(*_args, **_kwargs):
        cause = OSError(errno.ENOSPC, "No space left on device")
        raise CheckpointException("CheckpointException ranks:dict_keys([0, 1])", {0: (cause, None), 1: (cause, None)})

    monkeypatch.setattr("torch.distributed.checkpoint.save", full)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(OSError) as err:
        checkpoint.save(tmp_path, 3, model, torch.optim.AdamW(model.parameters()), {}, rank=0, keep=2)
    target = tmp_path / "step-00000003" / "dcp"
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert f"no space left on device writing {target} (No space left on device)" in disk_full_message(err.value)
    assert not (tmp_path / "step-00000003" / checkpoint.MARKER).exists()


def test_training_ends_with_the_ranks_errors_after_torchruns_report(tmp_path, monkeypatch, capfd):
    """torchrun prints its own report of a failed rank (a traceback each) after the ranks' lines: the stage's last
    line repeats what the ranks said, once per distinct message, the log keeping everything as it came."""
    from videogrpo.config import Config
    from videogrpo.config.sections import ParallelConfig
    from videogrpo.errors import VideoGRPOError
    from videogrpo.launch import node

    said = "no space left on device writing /r/checkpoints/step-00000002/dcp (No space left on device); free space"
    ranks = (
        f"import sys; print('[rank 1] error: {said}', flush=True); print('[rank 0] error: {said}', flush=True); "
        "print('progress\\r', end=''); print('Traceback (most recent call last):\\n' * 40, file=sys.stderr); "
        "sys.exit(1)"
    )
    monkeypatch.setattr(node.preflight, "node_checks", lambda cfg, port=None, **_: [])
    monkeypatch.setattr(node.torchrun, "torchrun_argv", lambda *a: [sys.executable, "-c", ranks])
    for var in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID"):
        monkeypatch.delenv(var, raising=False)
    cfg = Config(parallel=ParallelConfig(nodes=1, procs_per_node=2, device="cpu", backend="gloo"))
    job = node.NodeTraining("{}", "r", tmp_path / "run", tmp_path / "m", tmp_path / "d", tmp_path / "f", tmp_path, {})
    with pytest.raises(VideoGRPOError) as err:
        node.train_this_node(cfg, job)
    message = str(err.value)
    assert message.startswith(f"torchrun exited with code 1 on node 0 (complete checkpoints in {job.checkpoints}")
    assert message.splitlines()[-1] == f"  rank 1, 0: {said}"
    forwarded = capfd.readouterr().err
    assert f"[rank 0] error: {said}" in forwarded and "progress\r" in forwarded
    assert forwarded.count("Traceback (most recent call last):") == 40


FILL_THEN_FAIL = """
import errno, os, sys
from videogrpo import cli

disk = sys.argv[1]
parser = cli.build_parser()
args = parser.parse_args(["schema"])


def fill(_args):  # a stage that fills its file system to the last block, the log's included
    fd = os.open(os.path.join(disk, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\\0" * 4096)
    except OSError as err:
        raise OSError(err.errno, err.strerror, os.path.join(disk, "filler")) from None


args.handler = fill
parser.parse_args = lambda argv=None: args
cli.build_parser = lambda command=None: parser
sys.exit(cli.main([]))
"""


def test_a_stage_keeps_room_in_its_log_for_the_line_that_names_the_full_disk(small_disk):
    """Nothing the failed write leaves can be freed (not a byte left): the reserve kept beside the log while the
    stage ran is what lets its last line reach the log."""
    log = small_disk / "stage.log"
    with open(log, "wb") as sink:
        done = subprocess.run([sys.executable, "-c", FILL_THEN_FAIL, str(small_disk)], stdout=sink, stderr=sink)
    assert done.returncode == 2, log.read_text()
    assert log.read_text().splitlines()[-1].startswith(f"error: no space left on device writing {small_disk}/filler")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "stage.log"]  # the reserve is gone


def test_the_training_log_ends_with_its_last_lines_when_the_disk_fills_midway(small_disk, tmp_path):
    """The training rule's tee: the terminal gets every line; the log, once its disk is full, gets a note of what
    is missing and the last lines, the one that names the file and the fix among them."""
    last = "error: no space left on device writing /r/checkpoints/step-00000002/dcp; free space on that file system"
    lines = [f"[train] step {i} | reward 0.5 | {'x' * 200}" for i in range(3000)]  # about 650 KB: past the disk
    leave_free(small_disk, 128 * 1024)
    log, terminal = small_disk / "train.log", tmp_path / "terminal.txt"
    with open(terminal, "wb") as shown:
        done = subprocess.run(
            [sys.executable, "-m", "videogrpo.stages.log_tee", str(log)],
            input="\n".join([*lines, last, ""]).encode(),
            stdout=shown,
        )
    assert done.returncode == 0
    assert terminal.read_text().splitlines() == [*lines, last]
    kept = log.read_text().splitlines()
    assert kept[0] == lines[0] and kept[-1] == last
    (note,) = [line for line in kept if line.startswith(f"[{log}: ")]
    assert re.fullmatch(
        rf"\[{re.escape(str(log))}: \d+ bytes of output not written here, the file system being "
        r"full; the last \d+ of them follow\]",
        note,
    )
    after = kept[kept.index(note) + 1 :]
    assert after == lines[-len(after) + 1 :] + [last] and len(after) > 50  # whole lines, the last ones
    assert not list(small_disk.glob(".*.reserve"))
