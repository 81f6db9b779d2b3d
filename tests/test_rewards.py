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
    return ScoreRequest(frames, kw.pop("task", sample.task), str(sample.directory), **{
        k: v for k, v in args.items() if k != "task"})


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
    future = scorer.submit(ScoreRequest(frames, "Z-99_unknown_data-generator", str(sample.directory), 16, 64, 5.0,
                                        12, unsupported_score=0.25))
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
