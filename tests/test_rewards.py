import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from videogrpo.data.dataset import load_split
from videogrpo.data.video import read_video
from videogrpo.errors import DigestMismatch, VideoGRPOError
from videogrpo.provenance.digest import evalkit_source_digest
from videogrpo.rewards.evalkit import fingerprint
from videogrpo.rewards.request import gt_info
from videogrpo.rewards.rule import EvaluatorError, RuleScorer, ScoreRequest
from videogrpo.rewards.scorer_process import check_runtime


def request(sample, frames, **kw):
    args = dict(fps=16, video_size=128, max_seconds=5.0, crf=12, unsupported_score=0.0)
    args.update(kw)
    return ScoreRequest(
        frames, kw.pop("task", sample.task), str(sample.directory), **{k: v for k, v in args.items() if k != "task"}
    )


def test_fingerprint_matches_the_pin(evalkit):
    record = fingerprint(evalkit, evalkit_source_digest(evalkit))
    assert record["files"] == len(record["listing"]) and "run_evaluation.py" in record["listing"]


def test_an_edited_evalkit_file_fails_with_expected_and_found(evalkit, tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    pinned = evalkit_source_digest(kit)
    with open(kit / "vbvr_bench/evaluators/synthetic.py", "a") as f:
        f.write("# local tweak\n")
    with pytest.raises(DigestMismatch) as err:
        fingerprint(kit, pinned)
    message = str(err.value)
    assert f"expected {pinned}" in message and f"found    {evalkit_source_digest(kit)}" in message


def test_evaluators_using_easyocr_need_their_models(evalkit, tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    (kit / "vbvr_bench/ocr.py").write_text("import easyocr\nreader = easyocr.Reader(['en'])\n")
    with pytest.raises(VideoGRPOError, match=r"easyocr.Reader but .*/easyocr_models is missing; link the folder"):
        fingerprint(kit, evalkit_source_digest(kit))
    (kit / "easyocr_models").mkdir()
    (kit / "easyocr_models/english_g2.pth").write_bytes(b"weights")
    record = fingerprint(kit, evalkit_source_digest(kit))
    assert len(record["easyocr_models_tree_sha256"]) == 64  # the weights are part of the fingerprint


def test_runtime_contract_is_checked_and_fingerprinted():
    import numpy

    ok = check_runtime({"numpy": numpy.__version__})
    assert ok["found"] == {"numpy": numpy.__version__} and len(ok["fingerprint"]) == 64
    with pytest.raises(VideoGRPOError, match=r"numpy: contract 0.0.1, found " + numpy.__version__):
        check_runtime({"numpy": "0.0.1"})
    with pytest.raises(VideoGRPOError, match="not-a-package: contract 1.0, found not installed"):
        check_runtime({"not-a-package": "1.0"})


@pytest.fixture(scope="module")
def scorer(evalkit):
    with RuleScorer(evalkit, workers=2, threads_per_worker=1) as pool:
        yield pool


def test_ground_truth_scores_high_and_a_blank_video_low(scorer, dataset):
    samples = load_split(dataset, "rl")
    by_task = {}
    for s in samples:
        by_task.setdefault(s.task, s)
    futures = []
    for sample in by_task.values():
        gt = read_video(sample.directory / "video/ground_truth.mp4")
        futures.append(scorer.submit(request(sample, gt)))
        futures.append(scorer.submit(request(sample, np.zeros_like(gt))))
    results = scorer.collect(futures)
    for good, blank in zip(results[::2], results[1::2]):
        assert good["score"] > 0.9, good
        assert blank["score"] < good["score"] - 0.3, (good, blank)
        assert set(good["dimensions"]) == {"rule", "fidelity"}


def test_unknown_task_scores_unsupported_with_a_warning(scorer, dataset, capsys):
    sample = load_split(dataset, "rl")[0]
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    future = scorer.submit(
        ScoreRequest(
            frames, "Z-99_unknown_data-generator", str(sample.directory), 16, 64, 5.0, 12, unsupported_score=0.25
        )
    )
    (result,) = scorer.collect([future])
    assert result["score"] == 0.25
    assert "Z-99_unknown_data-generator is unknown to the EvalKit" in capsys.readouterr().err


SCORE_OF_GT = """import math

import numpy
from vbvr_bench.evaluators import TASK_EVALUATOR_MAP


def evaluate_single_video(video_path, task_name, gt_info=None, device="cuda"):
    value = eval(gt_info["score"], {"np": numpy, "math": math})  # what the test asks this evaluator to return
    return {"score": value, "dimensions": {"as": gt_info["score"], "np64": numpy.float64(0.25),
                                           "np32": numpy.float32(0.5), "arr": numpy.arange(2)}}
"""

SCORES = ["np.float32(0.5)", "np.float64(0.75)", "np.int64(1)", "0", "1", "0.25"]
NOT_SCORES = ["True", "np.bool_(True)", "math.nan", "np.float32('inf')", "1.5", "-0.1", "'0.5'", "None"]


def test_every_real_number_type_is_a_score_and_anything_else_an_error(evalkit, tmp_path, dataset, capsys):
    """numpy.float32/float64/int64 and Python numbers score as floats; a bool is no score; non-finite and
    out-of-range values, strings and None are errors that follow evalkit.fail_on_error, naming the value."""
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    (kit / "run_evaluation.py").write_text(SCORE_OF_GT)
    sample = load_split(dataset, "rl")[0]
    frames = np.zeros((5, 64, 64, 3), np.uint8)

    def asking(value):
        r = request(sample, frames, unsupported_score=0.125)
        r.gt = {**gt_info(str(sample.directory)), "score": value}  # the sample's files, and what to return
        return r

    with RuleScorer(kit, workers=2, threads_per_worker=1, fail_on_error=False) as pool:
        results = pool.collect([pool.submit(asking(v)) for v in SCORES + NOT_SCORES])
    for value, r in zip(SCORES, results):
        assert r["error"] is None and type(r["score"]) is float and r["score"] == float(eval(value, {"np": np})), r
        assert r["dimensions"] == {"as": value, "np64": 0.25, "np32": 0.5, "arr": [0, 1]}  # plain values
        assert all(type(v) in (str, float, list) for v in r["dimensions"].values())
    for r in results[len(SCORES) :]:
        assert r["score"] == 0.125 and "the contract is a finite score in [0, 1]" in r["error"], r
    assert "returned score True (bool)" in results[len(SCORES)]["error"]
    assert "returned score nan (float)" in results[len(SCORES) + 2]["error"]
    assert capsys.readouterr().err.count(f"warning: the EvalKit evaluator of task {sample.task} failed") == 1
    with RuleScorer(kit, workers=1, threads_per_worker=1, fail_on_error=True) as pool:
        with pytest.raises(EvaluatorError) as err:
            pool.collect([pool.submit(asking("1.5"))])
    message = str(err.value)
    assert sample.task in message and str(sample.directory) in message and "returned score 1.5 (float)" in message


def test_scorer_keeps_the_video_it_scored(scorer, dataset, tmp_path):
    sample = load_split(dataset, "rl")[0]
    gt = read_video(sample.directory / "video/ground_truth.mp4")
    keep = tmp_path / "kept.mp4"
    scorer.submit(request(sample, gt, keep_video=str(keep))).result()
    assert read_video(keep).shape == (gt.shape[0], 128, 128, 3)


FRAME_PROBE = '''"""An EvalKit entry point that reports what reached it: frames, frame rate, size, the last frame."""
import av


def evaluate_single_video(video_path, task_name, gt_info=None, device="cuda"):
    with av.open(video_path) as container:
        rate = float(container.streams.video[0].average_rate)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return {"score": 0.5, "dimensions": {"frames": len(frames), "fps": rate, "side": frames[0].shape[0],
                                         "last_mean": float(frames[-1].mean())}}
'''


@pytest.mark.parametrize("frames,max_seconds,fps", [(161, 5.0625, 32), (81, 5.0625, 16), (161, 5.0, 33), (17, 5.0, 16)])
def test_every_frame_reaches_the_evaluator_at_a_raised_frame_rate(evalkit, tmp_path, dataset, frames, max_seconds, fps):
    """An A14B rollout of 161 frames keeps all of them (evaluators score the last one); the rate rises instead."""
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    (kit / "run_evaluation.py").write_text(FRAME_PROBE)
    video = np.zeros((frames, 64, 96, 3), np.uint8)
    video[-1] = 255  # only the last frame is white
    sample = load_split(dataset, "rl")[0]
    with RuleScorer(kit, workers=1, threads_per_worker=1) as pool:
        result = pool.submit(request(sample, video, max_seconds=max_seconds)).result()
    seen = result["dimensions"]
    assert seen["frames"] == frames and seen["fps"] == fps and seen["side"] == 128
    assert seen["last_mean"] > 0.5 * 255 * 64 / 96  # the white frame, scaled to 128 x 85 and padded


def test_playback_rate_follows_the_duration_cap():
    from videogrpo.data.video import playback_fps

    assert playback_fps(81, 16, 5.0625) == 16 and playback_fps(161, 16, 5.0625) == 32
    assert playback_fps(81, 16, 5.0) == 17 and playback_fps(161, 16, 5.0) == 33 and playback_fps(5, 16, 5.0) == 16


def test_scorer_frames_are_lanczos_scaled_to_fit_and_padded():
    from PIL import Image

    from videogrpo.data.video import fit_square

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, 64, 96, 3), dtype=np.uint8)
    out = fit_square(frames, 128)
    assert out.shape == (2, 128, 128, 3)
    inner_h = round(64 * 128 / 96) // 2 * 2  # 85 rounded down to even, as ffmpeg's force_divisible_by=2
    top = (128 - inner_h) // 2
    expected = np.asarray(Image.fromarray(frames[1]).resize((128, inner_h), Image.LANCZOS))
    assert np.array_equal(out[1, top : top + inner_h], expected)
    assert not out[:, :top].any() and not out[:, top + inner_h :].any()


def broken_kit(evalkit, tmp_path, evaluator_body: str):
    """The reference EvalKit with the first synthetic task's evaluator replaced."""
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    path = kit / "vbvr_bench/evaluators/synthetic.py"
    source = path.read_text()
    head = "def move_red_square(final: np.ndarray, gt_final: np.ndarray, meta: dict) -> dict:\n"
    path.write_text(source.replace(head, head + evaluator_body, 1))
    return kit


@pytest.mark.parametrize("fail_on_error", [True, False])
def test_an_evaluator_error_stops_the_run_or_scores_zero_with_one_warning(
    evalkit, tmp_path, dataset, capsys, fail_on_error
):
    kit = broken_kit(evalkit, tmp_path, "    raise KeyError('meta_px')\n")
    samples = [s for s in load_split(dataset, "rl") if s.task.startswith("S-1_")][:2]
    videos = [read_video(s.directory / "video/ground_truth.mp4") for s in samples]
    with RuleScorer(kit, workers=1, threads_per_worker=1, fail_on_error=fail_on_error) as pool:
        futures = [pool.submit(request(s, v)) for s, v in zip(samples, videos)]
        if fail_on_error:
            with pytest.raises(VideoGRPOError) as err:
                pool.collect(futures)
            message = str(err.value)
            assert samples[0].task in message and str(samples[0].directory) in message
            assert "KeyError: 'meta_px'" in message and "evalkit.fail_on_error" in message
            return
        results = pool.collect(futures)
    assert [r["score"] for r in results] == [0.0, 0.0] and all("meta_px" in r["error"] for r in results)
    warned = capsys.readouterr().err
    assert warned.count("warning: the EvalKit evaluator of task S-1_") == 1 and "reward_errors" in warned


def test_a_worker_that_cannot_start_reports_the_cause(evalkit, tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    entry = kit / "run_evaluation.py"
    entry.write_text(entry.read_text().replace("import json\n", "import json\nimport cv2_that_is_not_installed\n", 1))
    with pytest.raises(VideoGRPOError, match=r"could not start .* No module named 'cv2_that_is_not_installed'"):
        RuleScorer(kit, workers=1, threads_per_worker=1)
    with pytest.raises(VideoGRPOError, match=r"could not start .*numpy: contract 0.0.1, found"):
        RuleScorer(evalkit, workers=1, threads_per_worker=1, runtime={"numpy": "0.0.1"})


ENVIRONMENT_PROBE = """import json, os


def evaluate_single_video(video_path, task_name, gt_info=None, device="cuda"):
    return {"score": 0.5, "dimensions": {"cwd": os.getcwd(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "easyocr": os.environ.get("EASYOCR_MODULE_PATH"), "video_abs": os.path.isabs(video_path),
            "gt_abs": os.path.isabs(gt_info["gt_final_frame"]),
            "annotations": os.path.isfile("annotations/tasks.json"), "threads": os.environ.get("OMP_NUM_THREADS")}}
"""


def test_workers_run_in_the_checkout_with_cuda_hidden_and_absolute_paths(evalkit, tmp_path, dataset, monkeypatch):
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    (kit / "run_evaluation.py").write_text(ENVIRONMENT_PROBE)
    monkeypatch.chdir(tmp_path)  # the driver elsewhere, with a relative sample path
    sample = load_split(dataset, "rl")[0]
    relative = os.path.relpath(sample.directory, tmp_path)
    with RuleScorer("kit", workers=1, threads_per_worker=3, easyocr_models="ocr-weights") as pool:
        frames = np.zeros((5, 64, 64, 3), np.uint8)
        seen = pool.submit(ScoreRequest(frames, sample.task, relative, 16, 64, 5.0, 12, 0.0)).result()["dimensions"]
    assert seen["cwd"] == str(kit) and seen["cuda"] == "" and seen["easyocr"] == str(kit / "ocr-weights")
    assert seen["annotations"] and seen["video_abs"] and seen["gt_abs"] and seen["threads"] == "3"


def test_the_reference_evalkit_reads_its_annotations_from_the_working_directory(evalkit, tmp_path):
    import subprocess
    import sys

    elsewhere = subprocess.run(
        [sys.executable, "-c", "import run_evaluation"],
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(evalkit), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
    )
    assert "annotations/tasks.json" in elsewhere.stderr  # as the real compatibility revisions: run it in the checkout
    inside = subprocess.run(
        [sys.executable, "-c", "import run_evaluation"], cwd=evalkit, capture_output=True, text=True
    )
    assert inside.returncode == 0, inside.stderr


def test_preflight_names_the_tasks_without_an_evaluator_and_fails_when_none_is_scorable(evalkit, dataset, tmp_path):
    from videogrpo import config
    from videogrpo.preflight.checks import check_evalkit_tasks

    def kit_config(path):
        return config.from_dict({"evalkit": {"path": str(path), "digest": evalkit_source_digest(path)}}, partial=True)

    assert check_evalkit_tasks(kit_config(evalkit), dataset).ok
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    registry = kit / "vbvr_bench/evaluators/__init__.py"
    source = registry.read_text()
    registry.write_text(source.replace('    "S-2_fill_circle_blue_data-generator": fill_circle_blue,\n', ""))
    some = check_evalkit_tasks(kit_config(kit), dataset)
    assert some.ok and "2 of 3 dataset tasks have an evaluator" in some.detail
    assert "S-2_fill_circle_blue_data-generator" in some.detail
    registry.write_text(source.split("TASK_EVALUATOR_MAP = {")[0] + 'TASK_EVALUATOR_MAP = {"G-1_other": None}\n')
    none = check_evalkit_tasks(kit_config(kit), dataset)
    tasks = (
        "S-1_move_red_square_data-generator, S-2_fill_circle_blue_data-generator, S-3_grow_bar_to_line_data-generator"
    )
    assert not none.ok and f"none of the dataset's 3 tasks ({tasks}) is in the TASK_EVALUATOR_MAP" in none.detail
    assert "which has 1 (G-1_other)" in none.detail, none.detail
    # A larger task list: its first three and how many more, beside how many tasks the EvalKit has.
    many = tmp_path / "many"
    many.mkdir()
    (many / "splits.json").write_text(json.dumps([{"task": f"T-{i}_task", "rl": [], "heldout": []} for i in range(7)]))
    named = check_evalkit_tasks(kit_config(kit), many)
    assert not named.ok and "none of the dataset's 7 tasks (T-0_task, T-1_task, T-2_task and 4 more)" in named.detail


def test_runtime_problems_cover_imports_cv2_and_the_ocr_assets():
    """What the release contract's probe can find wrong (measured on this machine: a CPU torch with PyPI's
    torchvision makes `import easyocr` fail with `operator torchvision::nms does not exist`)."""
    from videogrpo.rewards.evalkit import runtime_problems

    contract = {"easyocr": "1.7.2", "opencv-python": "4.13.0.92", "norfair": "2.3.0"}
    probe = {
        "found": {"easyocr": "1.7.2", "opencv-python": "4.13.0.92", "norfair": "2.3.0"},
        "imports": {"easyocr": "RuntimeError: operator torchvision::nms does not exist", "cv2": "ok", "norfair": "ok"},
        "checks": {"cv2_version": "4.12.0", "HoughLinesP_shape": [3, 4], "easyocr_en_char": None},
    }
    problems = runtime_problems(contract, probe)
    assert "import easyocr fails: RuntimeError: operator torchvision::nms does not exist" in problems
    assert "cv2.__version__ is 4.12.0, the contract pins opencv 4.13.0.92" in problems
    assert "cv2.HoughLinesP returned shape [3, 4], the evaluators need (N, 1, 4)" in problems
    assert "easyocr's character/en_char.txt is missing from the installed easyocr package" in problems
    probe["imports"]["easyocr"] = "ok"
    probe["checks"] = {"cv2_version": "4.13.0", "HoughLinesP_shape": [3, 1, 4], "easyocr_en_char": "/x/en_char.txt"}
    assert runtime_problems(contract, probe) == []


@pytest.mark.parametrize("fail_on_error", [True, False])
@pytest.mark.parametrize("breakage", ["the EvalKit raises", "a sample file is missing"])
def test_a_failure_outside_the_evaluator_follows_fail_on_error(
    evalkit, tmp_path, dataset, capsys, breakage, fail_on_error
):
    """An exception escaping evaluate_single_video, or a ground-truth file gone at scoring time: with
    fail_on_error false the sample scores unsupported_score, counts as an error, one warning per task; with
    true the run stops naming task, sample and message (not a bare RuntimeError or FileNotFoundError)."""
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    samples = [s for s in load_split(dataset, "rl") if s.task.startswith("S-1_")][:2]
    dirs = [tmp_path / f"sample{i}" for i in range(2)]
    for sample, copy in zip(samples, dirs):
        shutil.copytree(sample.directory, copy)
    if breakage == "the EvalKit raises":
        entry = kit / "run_evaluation.py"
        head = 'def evaluate_single_video(video_path, task_name, gt_info=None, device="cuda"):\n'
        entry.write_text(entry.read_text().replace(head, head + "    raise RuntimeError('the EvalKit broke')\n", 1))
        expected = "RuntimeError: the EvalKit broke"
    else:
        for copy in dirs:
            (copy / "video/prompt.txt").unlink()
        expected = "FileNotFoundError"
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    asks = [ScoreRequest(frames, samples[0].task, str(d), 16, 64, 5.0, 12, unsupported_score=0.25) for d in dirs]
    with RuleScorer(kit, workers=1, threads_per_worker=1, fail_on_error=fail_on_error) as pool:
        futures = [pool.submit(a) for a in asks]
        if fail_on_error:
            with pytest.raises(EvaluatorError) as err:
                pool.collect(futures)
            message = str(err.value)
            assert samples[0].task in message and str(dirs[0]) in message and expected in message
            assert "evalkit.fail_on_error" in message
            return
        results = pool.collect(futures)
    assert [r["score"] for r in results] == [0.25, 0.25] and all(expected in r["error"] for r in results)
    assert [r["sample"] for r in results] == [str(d) for d in dirs]
    warned = capsys.readouterr().err
    assert (
        warned.count(f"warning: the EvalKit evaluator of task {samples[0].task} failed") == 1
        and "reward_errors" in warned
    )
    assert "Traceback" in warned  # the worker logs where it was raised


GROUND_TRUTH = {
    "first_frame.png": "first frame, gt_first_frame",
    "video/final_frame.png": "final frame, gt_final_frame",
    "video/ground_truth.mp4": "ground-truth video, gt_video_path",
}


@pytest.mark.parametrize("fail_on_error", [True, False])
@pytest.mark.parametrize("missing", list(GROUND_TRUTH))
def test_a_ground_truth_file_missing_at_scoring_time_follows_fail_on_error(
    evalkit, tmp_path, dataset, capsys, missing, fail_on_error
):
    """The EvalKit scores a sample whose first frame, final frame or ground-truth video is gone without a word (the
    stand-in reads neither the first frame nor the video): each is checked before it is called. With fail_on_error
    true the run stops naming the file; false, the sample scores unsupported_score with the file as its error."""
    samples = [s for s in load_split(dataset, "rl") if s.task.startswith("S-1_")][:2]
    dirs = [Path(shutil.copytree(s.directory, tmp_path / f"sample{i}")) for i, s in enumerate(samples)]
    (dirs[0] / missing).unlink()
    gone = f"{dirs[0] / missing} ({GROUND_TRUTH[missing]})"
    videos = [read_video(s.directory / "video/ground_truth.mp4") for s in samples]
    asks = [
        ScoreRequest(v, s.task, str(d), 16, 128, 5.0, 12, unsupported_score=0.25)
        for s, d, v in zip(samples, dirs, videos)
    ]
    with RuleScorer(evalkit, workers=1, threads_per_worker=1, fail_on_error=fail_on_error) as pool:
        futures = [pool.submit(a) for a in asks]
        if fail_on_error:
            with pytest.raises(EvaluatorError) as err:
                pool.collect(futures)
            message = str(err.value)
            assert f"task {samples[0].task}: the sample {dirs[0]} cannot be scored" in message, message
            assert f"missing at scoring time: {gone}" in message and "evalkit.fail_on_error is true" in message
            return
        incomplete, complete = pool.collect(futures)
    assert incomplete["score"] == 0.25 and f"missing at scoring time: {gone}" in incomplete["error"]
    assert complete["error"] is None and complete["score"] > 0.9  # the sample beside it scores as before
    warned = capsys.readouterr().err
    assert f"warning: task {samples[0].task}: the sample {dirs[0]} cannot be scored" in warned
    assert "counted in reward_errors" in warned


def test_the_scorer_refuses_a_checkout_edited_since_it_was_pinned(evalkit, tmp_path):
    """RuleScorer.for_config recomputes the source digest: an edit that keeps the file's size and time (which no
    Snakemake rule sees), or one made after fingerprint_evalkit, is never scored with."""
    from videogrpo import config

    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    pinned = evalkit_source_digest(kit)
    cfg = config.from_dict(
        {"evalkit": {"path": str(kit), "digest": pinned, "runtime": [], "workers": 1, "threads_per_worker": 1}},
        partial=True,
    )
    path = kit / "vbvr_bench/evaluators/synthetic.py"
    before = path.stat()
    with RuleScorer.for_config(cfg, kit) as pool:
        assert "S-1_move_red_square_data-generator" in pool.tasks
        # An edit while the pool runs: the scores collected afterwards are refused.
        path.write_text(path.read_text().replace("COLOR_SCALE = 80.0", "COLOR_SCALE = 90.0"))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        with pytest.raises(DigestMismatch, match="evalkit.digest"):
            pool.collect([])
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    with pytest.raises(DigestMismatch) as err:
        RuleScorer.for_config(cfg, kit)
    message = str(err.value)
    assert f"expected {pinned} (evalkit.digest)" in message and f"found    {evalkit_source_digest(kit)}" in message


@pytest.mark.parametrize(
    "ending,status", [("os.kill(os.getpid(), signal.SIGKILL)", "killed by signal 9"), ("os._exit(3)", "exit status 3")]
)
def test_a_scorer_process_that_dies_fails_its_request_and_the_pool_with_its_cause(
    evalkit, tmp_path, dataset, ending, status
):
    """As a broken process pool: the request in flight and every later one fail, naming the task and sample it was
    scoring, how the process ended and its last log lines; nothing waits forever."""
    import re

    from videogrpo.rewards.rule import ScorerDied

    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    (kit / "run_evaluation.py").write_text(
        "import os, signal, sys\n\n\ndef evaluate_single_video(video_path, task_name, gt_info=None, device='cuda'):\n"
        "    print('evaluator: out of memory, say', file=sys.stderr, flush=True)\n"
        f"    {ending}\n"
    )
    samples = load_split(dataset, "rl")
    dying, later = samples[0], next(s for s in samples if s.task != samples[0].task)
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    scoring = re.escape(f"({status}) while scoring task {dying.task}, sample {dying.directory};")
    with RuleScorer(kit, workers=1, threads_per_worker=1) as pool:
        futures = [pool.submit(request(s, frames)) for s in (dying, later, later)]
        with pytest.raises(ScorerDied, match=scoring + r".*\n.*evaluator: out of memory, say"):
            pool.collect(futures)
        with pytest.raises(ScorerDied, match=scoring):  # a later request names the one the process died on
            futures[2].result(timeout=30)
        with pytest.raises(ScorerDied):
            pool.submit(request(later, frames))
