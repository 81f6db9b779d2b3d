import shutil
import warnings

import numpy as np
import pytest

from videogrpo.data.dataset import load_split
from videogrpo.data.video import read_video
from videogrpo.errors import DigestMismatch, VideoGRPOError
from videogrpo.provenance.digest import evalkit_source_digest
from videogrpo.rewards.evalkit import check_runtime, fingerprint
from videogrpo.rewards.rule import RuleScorer, ScoreRequest


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
    with pytest.raises(VideoGRPOError, match="easyocr_models/en_char.txt is missing"):
        fingerprint(kit, evalkit_source_digest(kit))
    (kit / "easyocr_models").mkdir()
    (kit / "easyocr_models/en_char.txt").write_text("abc")
    assert len(fingerprint(kit, evalkit_source_digest(kit))["easyocr_models_tree_sha256"]) == 64


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
    results = RuleScorer.collect(futures)
    for good, blank in zip(results[::2], results[1::2]):
        assert good["score"] > 0.9, good
        assert blank["score"] < good["score"] - 0.3, (good, blank)
        assert set(good["dimensions"]) == {"rule", "fidelity"}


def test_unknown_task_scores_unsupported_with_a_warning(scorer, dataset):
    sample = load_split(dataset, "rl")[0]
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    future = scorer.submit(
        ScoreRequest(
            frames, "Z-99_unknown_data-generator", str(sample.directory), 16, 64, 5.0, 12, unsupported_score=0.25
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (result,) = RuleScorer.collect([future])
    assert result["score"] == 0.25
    assert any("Z-99_unknown_data-generator is unknown to the EvalKit" in str(w.message) for w in caught)


def test_an_out_of_range_score_breaks_the_contract(evalkit, tmp_path, dataset):
    kit = tmp_path / "kit"
    shutil.copytree(evalkit, kit)
    path = kit / "run_evaluation.py"
    path.write_text(path.read_text().replace('"score": float(min(max(score, 0.0), 1.0))', '"score": 1.5'))
    sample = load_split(dataset, "rl")[0]
    with RuleScorer(kit, workers=1, threads_per_worker=1) as pool:
        future = pool.submit(request(sample, read_video(sample.directory / "video/ground_truth.mp4")))
        with pytest.raises(VideoGRPOError, match=r"score 1.5 .* finite score in \[0, 1\]"):
            future.result()


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
