"""The VLM judge client against a loopback chat-completions server (tests/judge_server.py), over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest
from judge_server import JudgeServer, video_frames

from videogrpo.errors import ConfigError, DigestMismatch, VideoGRPOError
from videogrpo.rewards.judge import (
    JudgeAnswerError,
    JudgeScorer,
    JudgeSettings,
    judge,
    load_rubrics,
    parse_answer,
)
from videogrpo.rewards.rule import ScoreRequest

GOOD = "goal_score: 80\nquality_score: 60\ngoal_weight: 70\nquality_weight: 30\ntotal_score: 74\nreason: close."


def rollout(frames: int = 81, bright_last: bool = True) -> np.ndarray:
    video = np.zeros((frames, 64, 96, 3), np.uint8)
    if bright_last:
        video[-1, :, :48] = 255  # half of the last frame bright
    return video


def settings(server, **kw) -> JudgeSettings:
    return JudgeSettings(server.endpoint, "qwen3.6-27b", **kw)


def test_a_valid_answer_maps_total_score_to_the_unit_interval():
    parsed = parse_answer(GOOD)
    assert parsed["score"] == 0.74 and parsed["aspects"] == {"goal": (80, 70), "quality": (60, 30)}


@pytest.mark.parametrize(
    "answer,problem",
    [
        (GOOD.replace("quality_weight: 30", "quality_weight: 40"), "the weights sum to 110, not 100"),
        (GOOD.replace("total_score: 74", "total_score: 140"), "`total_score` is 140, outside 0-100"),
        (GOOD.replace("reason: close.", ""), "missing line `reason"),
        (GOOD.replace("goal_weight: 70\n", ""), "aspects scored .* differ from aspects weighted"),
        (GOOD.replace("total_score: 74\n", ""), "missing line `total_score"),
        ("The video looks fine.", "no `<aspect>_score` lines"),
        (GOOD.replace("goal_score: 80", "goal_score: high"), "`goal_score` is 'high', not a number"),
    ],
)
def test_invalid_answers_are_named(answer, problem):
    with pytest.raises(JudgeAnswerError, match=problem):
        parse_answer(answer)


def test_the_rubric_source_is_pinned_by_its_digest_and_must_cover_the_tasks(tmp_path):
    source = tmp_path / "prompts.py"
    source.write_text('EVAL_PROMPTS = {"T-1_a": "Rate the goal.", "T-2_b": "Rate it."}\n')
    pinned = hashlib.sha256(source.read_bytes()).hexdigest()
    assert load_rubrics(source, pinned, ["T-1_a"])["T-1_a"] == "Rate the goal."
    with pytest.raises(ConfigError, match=r"no rubric for task\(s\) \['T-9_c'\]; the source covers 2 tasks"):
        load_rubrics(source, pinned, ["T-1_a", "T-9_c"])
    source.write_text(source.read_text() + "# edited\n")
    with pytest.raises(DigestMismatch, match="rubric source digest mismatch"):
        load_rubrics(source, pinned)


def test_the_request_is_the_references_and_the_score_comes_from_the_answer():
    first = np.full((720, 1280, 3), 128, np.uint8)
    with JudgeServer() as server:
        result = judge(settings(server), "Rate the goal.", first, rollout())
        (body,) = server.requests
    assert result["score"] == 0.5 and result["dimensions"] == {"goal_score": 50, "quality_score": 50}
    assert body["model"] == "qwen3.6-27b" and body["temperature"] == 0 and body["seed"] == 0
    assert body["max_tokens"] == 1024 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["media_io_kwargs"] == {"video": {"video_backend": "opencv", "num_frames": 32, "fps": -1}}
    assert body["mm_processor_kwargs"] == {"do_sample_frames": False}
    text, image, video = body["messages"][0]["content"]
    assert text == {"type": "text", "text": "Rate the goal."}
    from PIL import Image

    jpeg = Image.open(io.BytesIO(base64.b64decode(image["image_url"]["url"].split(",", 1)[1])))
    assert jpeg.format == "JPEG" and max(jpeg.size) == 512 and jpeg.size == (512, 288)
    frames, rate = video_frames(video["video_url"]["url"])
    assert len(frames) == 81 and rate == 16  # the whole rollout: the server samples its 32 frames itself
    assert sum(part["type"] == "image_url" for part in body["messages"][0]["content"]) == 1  # no ground truth


def test_an_invalid_answer_is_repaired_in_the_same_conversation():
    with JudgeServer(mode="malformed") as server:
        result = judge(settings(server), "Rate.", rollout()[0], rollout(), sleep=lambda s: None)
        first, second = server.requests
    assert result["score"] == 0.5 and result["attempts"] == 2
    assert len(first["messages"]) == 1
    assistant, repair = second["messages"][1:]
    assert assistant == {"role": "assistant", "content": "Looks plausible to me."}
    assert repair["role"] == "user" and "no `<aspect>_score` lines" in repair["content"]


def test_server_errors_are_retried_with_exponential_backoff():
    waits = []
    with JudgeServer(mode="failing", failures=2) as server:
        result = judge(settings(server, max_retries=2), "Rate.", rollout()[0], rollout(), sleep=waits.append)
    assert result["score"] == 0.5 and waits == [1.0, 2.0]


def test_a_slow_server_times_out_and_scores_the_error_score_with_the_reason():
    with JudgeServer(mode="slow", delay=3) as server:
        slow = settings(server, timeout_s=0.5, max_retries=1, error_score=0.0)
        result = judge(slow, "Rate.", rollout()[0], rollout(), sleep=lambda s: None)
    assert result["score"] == 0.0 and "gave up after 2 attempts" in result["error"] and "timed out" in result["error"]


@pytest.mark.parametrize("fail_on_error", [True, False])
def test_the_scorer_stops_the_run_or_counts_the_failure(tmp_path, capsys, fail_on_error, dataset):
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")[:2]
    rubrics = {s.task: "Rate." for s in samples}
    with JudgeServer(mode="slow", delay=2) as server:
        with JudgeScorer(settings(server, timeout_s=0.3, max_retries=0), rubrics, 2, fail_on_error) as scorer:
            futures = [
                scorer.submit(ScoreRequest(rollout(17), s.task, str(s.directory), 16, 0, 5.0, 12, 0.0)) for s in samples
            ]
            if fail_on_error:
                with pytest.raises(VideoGRPOError, match=r"the judge could not score task .* timed out"):
                    scorer.collect(futures)
                return
            results = scorer.collect(futures)
    assert [r["score"] for r in results] == [0.0, 0.0] and all(r["error"] for r in results)
    assert "warning: judge failed on task" in capsys.readouterr().err


def test_concurrent_requests_score_every_rollout(dataset):
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")
    with JudgeServer() as server:
        with JudgeScorer(settings(server), {s.task: "Rate." for s in samples}, 3, True) as scorer:
            videos = [rollout(17, bright_last=i % 2 == 0) for i in range(len(samples))]
            futures = [
                scorer.submit(ScoreRequest(v, s.task, str(s.directory), 16, 0, 5.0, 12, 0.0))
                for s, v in zip(samples, videos)
            ]
            results = scorer.collect(futures)
        assert len(server.requests) == len(samples)
    assert [r["score"] for r in results] == [0.5 if i % 2 == 0 else 0.0 for i in range(len(samples))]


def service_config(tmp_path, command, **reward):
    import socket

    from videogrpo import config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fields = dict(kind="vbvr_vlm", judge_port=port, judge_serve_command=command, judge_ready_timeout_s=30, **reward)
    return config.from_dict({"reward": fields}, partial=True)


STAND_IN = [sys.executable, str(Path(__file__).parent / "judge_server.py"), "--port", "{port}", "--name", "{name}"]


def test_the_job_starts_the_judge_service_waits_for_it_and_stops_it(tmp_path):
    import urllib.error
    import urllib.request

    from videogrpo.rewards.judge_service import judge_service

    cfg = service_config(tmp_path, [*STAND_IN, "--startup-delay", "1.5", "--tp", "{tensor_parallel}"])
    log = tmp_path / "judge.log"
    with judge_service(cfg, tmp_path / "model", log) as endpoint:
        result = judge(JudgeSettings(endpoint, "qwen3.6-27b"), "Rate.", rollout()[0], rollout())
        assert result["score"] == 0.5
    assert "judge stand-in serving qwen3.6-27b" in log.read_text()
    with pytest.raises(urllib.error.URLError):  # stopped with the block: nothing listens any more
        urllib.request.urlopen(endpoint + "/v1/models", timeout=5)


def test_a_judge_service_that_dies_or_serves_another_model_fails_with_its_log(tmp_path):
    from videogrpo.rewards.judge_service import judge_service

    dying = service_config(tmp_path, [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"])
    with pytest.raises(VideoGRPOError, match=r"exited with code 3 before it was ready(.|\n)*CUDA out of memory"):
        with judge_service(dying, tmp_path / "model", tmp_path / "a.log"):
            pass
    other = service_config(tmp_path, [*STAND_IN[:-1], "qwen3.6-27b"], judge_served_name="another-model")
    with pytest.raises(VideoGRPOError, match="serves \\['qwen3.6-27b'\\], not reward.judge_served_name"):
        with judge_service(other, tmp_path / "model", tmp_path / "b.log"):
            pass


def test_preflight_checks_the_rubric_source_against_the_dataset(dataset, repo, tmp_path):
    from videogrpo import config
    from videogrpo.preflight import check_judge_rubrics

    source = repo / "src/videogrpo/rewards/reference_judge_prompts.py"
    pinned = hashlib.sha256(source.read_bytes()).hexdigest()

    def cfg(path, digest):
        fields = {"kind": "vbvr_vlm", "judge_prompts": str(path), "judge_prompts_digest": digest}
        return config.from_dict({"reward": fields}, partial=True)

    ok = check_judge_rubrics(cfg(source, pinned), dataset)
    assert ok.ok and "rubrics for all 3 tasks" in ok.detail
    partial = tmp_path / "prompts.py"
    partial.write_text('EVAL_PROMPTS = {"S-1_move_red_square_data-generator": "Rate."}\n')
    short = check_judge_rubrics(cfg(partial, hashlib.sha256(partial.read_bytes()).hexdigest()), dataset)
    assert not short.ok and "no rubric for task(s)" in short.detail and "covers 1 tasks" in short.detail
