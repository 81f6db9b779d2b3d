import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from videogrpo.data.dataset import batch_for_step, load_split, steps_per_epoch, training_order
from videogrpo.data.materialize import FIELDS, materialize
from videogrpo.data.validate import in_order, validate
from videogrpo.data.video import decoded_shape, read_video
from videogrpo.demo import synthetic_dataset
from videogrpo.errors import DataError

from conftest import FRAMES, SAMPLES, SIDE, TASKS
from harness import data_stage

TASK = TASKS[0]


def write_tar(path: Path, members: dict[str, bytes], kinds: dict[str, bytes] | None = None) -> Path:
    with gzip.open(path, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, kind in (kinds or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return path


def one_sample(index=0) -> dict[str, bytes]:
    return synthetic_dataset.sample_members(TASK, index, 0, FRAMES, SIDE, SIDE, 16)


def unpack(tmp_path, archives, tasks=(TASK,), per_task=1, **kw):
    return materialize(
        archives, tmp_path / "out", list(tasks), per_task, 0, 42, "s", {"repo": "t"}, log=lambda _: None, **kw
    ).record


def test_archives_hold_exactly_the_vbvr_member_layout(archives):
    names = []
    for path in sorted((archives / "VBVR-Pro-RL-Video").glob("*.tar.gz")):
        with tarfile.open(path) as tar:
            names += tar.getnames()
    fields = {"/".join(n.split("/")[3:]) for n in names}
    assert fields == set(FIELDS) | {"video/generation_info.json"}
    assert {n.split("/")[0] for n in names} == set(TASKS)
    assert len(names) == len(TASKS) * SAMPLES * 6


def test_archives_are_byte_reproducible(tmp_path):
    a = synthetic_dataset.generate(tmp_path / "a", TASKS[:1], 2, 0, FRAMES, SIDE, SIDE, 16)
    b = synthetic_dataset.generate(tmp_path / "b", TASKS[:1], 2, 0, FRAMES, SIDE, SIDE, 16)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_synthetic_tasks_at_the_real_count_and_parallel_archives(tmp_path):
    names = synthetic_dataset.task_names(50)
    assert len(set(names)) == 50 and names[:3] == TASKS
    assert names[3] == "S-4_move_red_square_v2_data-generator"
    assert all(synthetic_dataset.rule_of(name) is not None for name in names)
    # A variant draws its own samples: the seed includes the task name.
    variant = synthetic_dataset.sample_members(names[3], 0, 0, 5, 32, 32, 16)
    assert [v for k, v in variant.items() if k.endswith(".png")] != [
        v for k, v in synthetic_dataset.sample_members(TASK, 0, 0, 5, 32, 32, 16).items() if k.endswith(".png")
    ]
    with pytest.raises(ValueError, match="no synthetic generator for tasks"):
        synthetic_dataset.generate(tmp_path / "x", ["S-9_paint_it_black_v2_data-generator"], 1, 0, 5, 32, 32, 16)
    args = (names[:4], 2, 0, 5, 32, 32, 16)
    one = synthetic_dataset.generate(tmp_path / "one", *args, tasks_per_archive=1)
    two = synthetic_dataset.generate(tmp_path / "two", *args, tasks_per_archive=1, workers=2)
    assert len(one) == 4 and [p.read_bytes() for p in one] == [p.read_bytes() for p in two]


def test_ground_truth_video_ends_on_the_final_frame(dataset):
    from PIL import Image

    sample = load_split(dataset, "rl")[0]
    video = read_video(sample.directory / "video/ground_truth.mp4")
    assert video.shape == (FRAMES, SIDE, SIDE, 3)
    final = np.asarray(Image.open(sample.directory / "video/final_frame.png").convert("RGB")).astype(int)
    assert np.abs(video[-1].astype(int) - final).mean() < 4  # H.264 at CRF 10 is near-lossless


def test_materialize_writes_index_splits_and_record(dataset):
    index = json.loads((dataset / "dataset.json").read_text())
    assert sorted(index["tasks"]) == sorted(TASKS)
    splits = json.loads((dataset / "splits.json").read_text())
    for entry in splits:
        assert set(entry) == {"task", "source", "split", "rl", "heldout"}
        assert len(entry["heldout"]) == 1 and len(entry["rl"]) == SAMPLES - 1
        assert not set(entry["rl"]) & set(entry["heldout"])
    record = json.loads((dataset / "materialization.json").read_text())
    assert record["counts"]["samples"] == len(TASKS) * SAMPLES
    assert record["counts"]["members_ignored"] == len(TASKS) * SAMPLES
    assert all(len(a["sha256"]) == 64 for a in record["archives"])


def test_duplicate_missing_unknown_and_miscounted_samples(tmp_path):
    members = one_sample()
    a = write_tar(tmp_path / "a.tar.gz", members)
    b = write_tar(tmp_path / "b.tar.gz", {k: v for k, v in members.items() if k.endswith("prompt.txt")})
    with pytest.raises(DataError, match="appears twice"):
        unpack(tmp_path, [a, b])
    c = write_tar(tmp_path / "c.tar.gz", {k: v for k, v in one_sample(1).items() if not k.endswith(".mp4")})
    with pytest.raises(DataError, match="lacks video/ground_truth.mp4"):
        unpack(tmp_path, [c])
    with pytest.raises(DataError, match="not in data.task_list"):
        unpack(tmp_path, [a], tasks=(TASKS[1],))
    with pytest.raises(DataError, match=r"data.samples_per_task = 2: \{.*: 1\}"):
        unpack(tmp_path, [a], per_task=2)


def test_validate_accepts_the_synthetic_dataset(dataset):
    report = validate(dataset, TASKS, SAMPLES, FRAMES, SIDE, SIDE, workers=2, log=lambda _: None)
    assert report["samples"] == len(TASKS) * SAMPLES
    assert report["video_shapes_frames_h_w"] == {f"{FRAMES}x{SIDE}x{SIDE}": len(TASKS) * SAMPLES}


def test_validate_names_the_bad_file_and_the_field(tmp_path):
    archive = write_tar(tmp_path / "a.tar.gz", one_sample())
    unpack(tmp_path, [archive])
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"ground_truth.mp4: {FRAMES} frames, expected 9 \(data.gt_frames\)"):
        validate(out, [TASK], 1, 9, None, None, log=lambda _: None)
    next(out.rglob("ground_truth.mp4")).write_bytes(b"not a video")
    with pytest.raises(DataError, match="ground_truth.mp4: cannot decode video"):
        validate(out, [TASK], 1, None, None, None, log=lambda _: None)
    with pytest.raises(DataError, match="1 samples, expected data.samples_per_task = 2"):
        validate(out, [TASK], 2, None, None, None, log=lambda _: None)


def test_validate_reports_every_problem_in_sample_order_across_chunks(tmp_path):
    """Past the first chunks of samples a worker checks (validate._CHUNK), problems still come back, in order."""
    per_task = 40
    archives = synthetic_dataset.generate(tmp_path / "a", [TASK], per_task, 0, 5, 32, 32, 16)
    unpack(tmp_path, archives, per_task=per_task)
    out = tmp_path / "out"
    report = validate(out, [TASK], per_task, 5, 32, 32, workers=2, log=lambda _: None)
    assert report["samples"] == per_task and report["video_shapes_frames_h_w"] == {"5x32x32": per_task}
    videos = sorted(out.rglob("ground_truth.mp4"))
    assert decoded_shape(videos[0]) == read_video(videos[0]).shape[:3]
    videos[-1].write_bytes(b"not a video")
    (videos[21].parent / "prompt.txt").write_text("  \n")
    with pytest.raises(DataError, match=r"\(2 problems\):\n  .*_00021/video/prompt.txt: empty prompt\n  .*_00039/"):
        validate(out, [TASK], per_task, 5, 32, 32, workers=2, log=lambda _: None)


def test_in_order_keeps_a_bounded_window_in_flight():
    from concurrent.futures import ThreadPoolExecutor

    submitted = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, *args):
            submitted.append(args[0])
            return super().submit(fn, *args)

    with Counting(max_workers=2) as pool:
        got = []
        for value in in_order(pool, lambda item, factor: item * factor, range(20), 3, 10):
            got.append(value)
            assert len(submitted) <= len(got) + 3  # never more than 3 ahead of what was consumed
    assert got == [10 * i for i in range(20)] and submitted == list(range(20))


def test_training_order_is_a_fixed_shuffle_and_batches_drop_the_remainder(dataset):
    samples = load_split(dataset, "rl")
    assert [s.task for s in samples] == sorted(s.task for s in samples)  # task-grouped on disk
    order = training_order(samples, 42)
    assert order == training_order(samples, 42) and order != samples
    assert sorted(order, key=lambda s: (s.task, s.sample_id)) == sorted(samples, key=lambda s: (s.task, s.sample_id))
    per_epoch = steps_per_epoch(len(order), 4)
    assert per_epoch == len(order) // 4
    epoch, batch = batch_for_step(order, 4, per_epoch)
    assert epoch == 1 and batch == order[:4]


def _encode_digest(frames) -> str:
    import hashlib
    import tempfile

    from videogrpo.data.video import write_mp4

    with tempfile.TemporaryDirectory() as tmp:
        write_mp4(f"{tmp}/v.mp4", frames, fps=16, crf=12)
        return hashlib.sha256(open(f"{tmp}/v.mp4", "rb").read()).hexdigest()


def test_mp4_encoding_is_deterministic_across_busy_processes(tiny_model):
    """Rewards are read from these files: equal frames must encode to equal bytes in every scorer process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    from videogrpo.data.video import fit_square
    from videogrpo.models.wan import WanTI2V

    wan = WanTI2V(tiny_model, torch.device("cpu"), max_text_tokens=8)
    torch.manual_seed(0)
    videos = [fit_square(v, 64) for v in wan.decode(torch.randn(4, *wan.geometry(5, 32, 32).shape))]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for frames in videos:
            assert len(set(pool.map(_encode_digest, [frames] * 12))) == 1


def test_progress_is_plain_lines_in_a_log_and_a_rich_bar_on_a_terminal(tmp_path):
    import io
    import os
    import pty

    from videogrpo.progress import Progress

    log = io.StringIO()
    progress = Progress("unpack 2 archives", total=4 * 2**20, unit="B", interval=0, stream=log)
    progress.update(2**20, files=3)
    progress.finish()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("unpack 2 archives: 1.0 MB/4.0 MB (25%), 3 files, ") and "ETA" in lines[0]
    assert lines[-1].startswith("unpack 2 archives: 1.0 MB/4.0 MB (25%), 3 files")
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        bar = Progress("download org/x", total=2**20, unit="B", stream=terminal)
        bar.update(2**19, files=1)
        bar.finish()
    import select

    chunks = []
    while select.select([leader], [], [], 0.5)[0]:  # everything rich wrote, in as many reads as it takes
        try:
            chunks.append(os.read(leader, 65536))
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
    shown = b"".join(chunks).decode(errors="replace")
    assert "download org/x" in shown and "1 files" in shown and "━" in shown  # rich's bar, not a plain line


def test_the_stages_check_each_other_and_repair_through_the_config(tmp_path, repo):
    """fetch -> materialize -> validate through the CLI with their manifests: validation re-hashes raw/ against
    what materialize recorded, and `data.verify_existing` (a config field) repairs and names the file."""
    import os
    import subprocess

    def stage(name: str, *args: str, verify: bool = False) -> subprocess.CompletedProcess:
        return data_stage(tmp_path, name, *args, verify_existing=verify)

    archives, dataset = tmp_path / "archives", tmp_path / "materialized"
    assert stage("fetch-dataset", "--out", str(archives)).returncode == 0
    upstream = ["--upstream", str(tmp_path / "fetch-dataset.manifest.json")]
    made = stage("materialize-dataset", "--archives", str(archives), "--out", str(dataset), *upstream)
    assert made.returncode == 0, made.stderr
    manifest = json.loads((tmp_path / "materialize-dataset.manifest.json").read_text())
    fetched = json.loads((tmp_path / "fetch-dataset.manifest.json").read_text())
    assert manifest["inputs"]["archives"]["tree_sha256"] == fetched["outputs"]["archives"]["tree_sha256"]
    validate_args = ["--dataset", str(dataset), "--out", str(tmp_path / "v.json")]
    validate_args += ["--upstream", str(tmp_path / "materialize-dataset.manifest.json")]
    assert stage("validate-dataset", *validate_args).returncode == 0
    prompt = next((dataset / "raw").rglob("prompt.txt"))
    st = prompt.stat()
    prompt.write_bytes(b"Q" * st.st_size)  # same size, mtime put back: only a hash can tell
    os.utime(prompt, ns=(st.st_atime_ns, st.st_mtime_ns))
    refused = stage("validate-dataset", *validate_args)
    assert refused.returncode == 4, refused.stderr
    assert "is not what materialize_dataset made" in refused.stderr and prompt.name in refused.stderr
    repaired = stage("materialize-dataset", "--archives", str(archives), "--out", str(dataset), *upstream, verify=True)
    assert repaired.returncode == 0, repaired.stderr
    assert f"repairing raw/{prompt.relative_to(dataset / 'raw')}" in repaired.stdout + repaired.stderr
    assert stage("validate-dataset", *validate_args).returncode == 0
