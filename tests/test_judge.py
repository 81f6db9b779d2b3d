"""The VLM judge client against a loopback chat-completions server (demo.stand_in_judge), over real HTTP.

What the server received is decoded and compared part by part with docs/reference-system.md#vlm-judge; retry counts are
observed on the server side."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from videogrpo.demo import stand_in_judge_protocol as stand_in_protocol
from videogrpo.demo.stand_in_judge import JudgeServer, video_frames
from videogrpo.errors import VideoGRPOError
from videogrpo.rewards.judge import JudgeScorer, JudgeSettings, judge
from videogrpo.rewards.judge_protocol import (
    JudgeAnswerError,
    load_protocol,
    load_rubrics,
    mp4_data_url,
    output_regex,
)
from videogrpo.rewards.rule import ScoreRequest

from conftest import JUDGE_FIELDS, PROTOCOL_FILE, RUBRIC_FILE

TASK = "S-1_move_red_square_data-generator"
FIELDS = JUDGE_FIELDS


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


PROTOCOL = load_protocol(PROTOCOL_FILE, sha(PROTOCOL_FILE))
RUBRICS = load_rubrics(RUBRIC_FILE, sha(RUBRIC_FILE))
RUBRIC = RUBRICS[TASK]


def rollout(frames: int = 81, bright_last: bool = True, height: int = 64, width: int = 96) -> np.ndarray:
    video = np.zeros((frames, height, width, 3), np.uint8)
    if bright_last:
        video[-1, :, : width // 2] = 255  # half of the last frame bright
    return video


def settings(server, **kw) -> JudgeSettings:
    return JudgeSettings(server.endpoint, "qwen3.6-27b", **kw)


def run_judge(server, rubric=RUBRIC, sleep=None, frames=None, first=None, **kw) -> dict:
    frames = rollout() if frames is None else frames
    first = frames[0] if first is None else first
    return judge(settings(server, **kw), PROTOCOL, rubric, first, frames, sleep=sleep or (lambda s: None))


def data_of(url: str, kind: str) -> bytes:
    prefix = f"data:{kind};base64,"
    assert url.startswith(prefix)
    return base64.b64decode(url[len(prefix) :])


# ---- the request ------------------------------------------------------------------------------------------


def test_the_request_is_the_references_part_by_part():
    import av
    from PIL import Image

    first = np.random.default_rng(0).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    video = rollout()
    with JudgeServer() as server:
        result = run_judge(server, first=first, frames=video)
        (body,) = server.requests
    assert result["score"] == 0.5 and result["requests"] == 1 and result["repairs"] == 0
    assert result["dimensions"] == {"goal_score": 50, "quality_score": 50, "goal_weight": 50, "quality_weight": 50}
    (message,) = body["messages"]
    assert message["role"] == "user"
    rubric, label_first, image, label_video, mp4, reminder = message["content"]
    assert rubric == {"type": "text", "text": RUBRIC.strip()}
    assert label_first == {"type": "text", "text": "First frame (input):"}
    assert label_video == {
        "type": "text",
        "text": "Generated video (81 source frames encoded at 16 FPS, chronological order):",
    }
    assert reminder == {"type": "text", "text": stand_in_protocol.TASK_VLM_JUDGE_OUTPUT_REMINDER}
    assert image["type"] == "image_url" and set(image) == {"type", "image_url"}
    jpeg = Image.open(io.BytesIO(data_of(image["image_url"]["url"], "image/jpeg")))
    assert jpeg.format == "JPEG" and jpeg.size == (512, 288)  # longest edge 512, aspect kept
    expected = io.BytesIO()
    Image.fromarray(first).resize((512, 288)).save(expected, format="JPEG", quality=85)
    assert jpeg.quantization == Image.open(expected).quantization  # quality 85
    assert mp4["type"] == "video_url" and set(mp4) == {"type", "video_url"}
    raw = data_of(mp4["video_url"]["url"], "video/mp4")
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        assert (stream.width, stream.height) == (96, 64) and stream.average_rate == 16
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 81  # the whole rollout: the server samples its 32 frames itself
    assert np.abs(decoded[-1].astype(int) - video[-1]).mean() < 8
    assert body["model"] == "qwen3.6-27b" and body["temperature"] == 0 and body["seed"] == 0
    assert body["max_tokens"] == 1024 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["media_io_kwargs"] == {"video": {"video_backend": "opencv", "num_frames": 32, "fps": -1}}
    assert body["mm_processor_kwargs"] == {"do_sample_frames": False}
    assert body["structured_outputs"] == {"regex": output_regex(RUBRIC)}
    lines = body["structured_outputs"]["regex"].split("\n")
    assert [line.split(":")[0] for line in lines] == FIELDS  # one line per field, the rubric's order


def test_a_large_rollout_is_scaled_down_to_even_sides_and_an_odd_one_is_refused():
    import av

    raw = base64.b64decode(mp4_data_url(rollout(5, height=720, width=1000), fps=16).split(",", 1)[1])
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height) == (512, 368) and stream.frames == 5  # 368.64 -> 369 -> even
    with JudgeServer() as server:
        result = run_judge(server, frames=rollout(5, height=63, width=96))
        assert server.requests == []
    assert result["score"] == 0.0 and "needs even sides, not 96x63" in result["error"]


def test_the_frame_rate_is_the_judges_own_setting():
    with JudgeServer() as server:
        run_judge(server, fps=24)
        (body,) = server.requests
    assert "encoded at 24 FPS" in body["messages"][0]["content"][3]["text"]
    assert video_frames(body["messages"][0]["content"][4]["video_url"]["url"])[1] == 24


def test_an_environment_proxy_never_carries_loopback_judge_traffic(tmp_path):
    import os
    import subprocess

    # A fresh process: urllib reads the proxy variables when its opener is first built.
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import test_judge as t\n"
        "with t.JudgeServer() as server:\n"
        "    print(t.run_judge(server, max_retries=0), len(server.requests))\n"
    )
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "all_proxy")}
    env["http_proxy"] = "http://127.0.0.1:9"  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "'score': 0.5" in out.stdout and out.stdout.rstrip().endswith(" 1")


# ---- retries, counted on the server ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["429", "500", "503", "drop", "bad_json"])
def test_transport_failures_are_retried_max_retries_times_then_score_the_error_score(mode):
    waits = []
    with JudgeServer(mode=mode) as server:
        result = run_judge(server, sleep=waits.append, max_retries=2, error_score=0.125)
        assert server.counts == {mode: 3}  # one request and two retries, then it gives up
    assert result["score"] == 0.125 and waits == [1.0, 2.0] and "after 3 requests" in result["error"]
    if mode.isdigit():
        assert f"HTTP {mode}" in result["error"] and f"stand-in {mode}" in result["error"]  # the body's excerpt


@pytest.mark.parametrize("mode", ["429", "500", "drop", "bad_json"])
def test_a_transient_transport_failure_is_retried_with_backoff(mode):
    waits = []
    with JudgeServer(mode=mode, failures=2) as server:
        result = run_judge(server, sleep=waits.append, max_retries=2)
        assert server.counts == {mode: 2, "answered": 1}
    assert result["score"] == 0.5 and result["requests"] == 3 and waits == [1.0, 2.0]


def test_a_slow_server_times_out_each_request_and_scores_the_error_score():
    with JudgeServer(mode="slow", delay=2) as server:
        result = run_judge(server, timeout_s=0.3, max_retries=1)
        assert server.counts == {"slow": 2}
    assert result["score"] == 0.0 and "timed out" in result["error"] and "after 2 requests" in result["error"]


OTHER_MODEL = "The model `another-model` does not exist"


@pytest.mark.parametrize(
    "mode,model,message", [("400", "qwen3.6-27b", "stand-in 400"), ("good", "another-model", OTHER_MODEL)]
)
def test_other_http_errors_fail_after_exactly_one_request(mode, model, message):
    waits = []
    with JudgeServer(mode=mode) as server:
        result = judge(JudgeSettings(server.endpoint, model), PROTOCOL, RUBRIC, rollout()[0], rollout(), waits.append)
        assert len(server.requests) == 1
    status = "404" if mode == "good" else mode
    assert result["score"] == 0.0 and waits == [] and f"HTTP {status}" in result["error"] and message in result["error"]


def test_an_invalid_answer_is_repaired_in_the_same_conversation_max_retries_times():
    waits = []
    with JudgeServer(mode="invalid") as server:
        result = run_judge(server, sleep=waits.append, max_retries=2)
        assert server.counts == {"invalid": 3}
        first, second, third = server.requests
    assert result["score"] == 0.0 and "invalid answer after 2 repairs" in result["error"]
    assert waits == [1.0, 2.0]
    assert len(first["messages"]) == 1 and len(second["messages"]) == 3 and len(third["messages"]) == 5
    assert second["messages"][0] == first["messages"][0] and third["messages"][:3] == second["messages"]
    for body in (second, third):
        assistant, repair = body["messages"][-2:]
        assert assistant["role"] == "assistant" and "goal_weight: 40" in assistant["content"]
        error = "the *_weight values add up to 90, not 100"
        assert repair == {
            "role": "user",
            "content": f"{stand_in_protocol.TASK_VLM_JUDGE_REPAIR_PROMPT}\nValidation error: {error}",
        }
        assert body["structured_outputs"] == first["structured_outputs"]


def test_the_repair_quotes_at_most_300_characters_of_the_error(monkeypatch):
    from videogrpo.rewards import judge_protocol

    def long_error(answer, fields):
        raise JudgeAnswerError("x" * 500)

    monkeypatch.setattr("videogrpo.rewards.judge.validate_answer", long_error)
    with JudgeServer() as server:
        run_judge(server, max_retries=1)
        repair = server.requests[1]["messages"][-1]["content"]
    assert repair == judge_protocol.repair_text(PROTOCOL, "x" * 300) and repair.endswith(
        "\nValidation error: " + "x" * 300
    )


def test_a_repaired_answer_scores():
    with JudgeServer(mode="invalid", failures=1) as server:
        result = run_judge(server, max_retries=2)
        assert server.counts == {"invalid": 1, "answered": 1}
    assert result["score"] == 0.5 and result["repairs"] == 1 and result["requests"] == 2


def test_the_two_budgets_nest_every_repair_request_retries_its_own_transport_failures():
    waits = []
    with JudgeServer(script=["500", "invalid", "429", "500", "good"]) as server:
        result = run_judge(server, sleep=waits.append, max_retries=2)
        assert server.counts == {"500": 2, "429": 1, "invalid": 1, "answered": 1}
    assert result["score"] == 0.5 and result["requests"] == 5 and result["repairs"] == 1
    assert waits == [1.0, 1.0, 1.0, 2.0]  # transport 2^0; repair 2^0; the repair's transport 2^0, 2^1


def test_the_stand_in_refuses_what_vllm_refuses():
    def post(body) -> tuple[int, str]:
        request = urllib.request.Request(
            server.endpoint + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    with JudgeServer() as server:
        run_judge(server)
        (good,) = server.requests
        assert post(dict(good, structured_outputs={"regex": "goal_score: ("}))[0] == 400
        assert post(dict(good, structured_outputs={"regex": "x", "json": {}}))[0] == 400
        assert post(dict(good, messages=[]))[0] == 400
        assert post(dict(good, model="gpt-4"))[0] == 404
        assert post(dict(good, structured_outputs={"regex": "total_score: [0-9]+"}))[0] == 400  # cannot be met
        status, text = post({k: v for k, v in good.items() if k != "structured_outputs"})
        assert status == 200 and "plausible" in text  # unconstrained: prose
        status, text = post({k: v for k, v in good.items() if k != "model"})
        assert status == 200 and "total_score: 50" in text  # vLLM serves its model
        assert server.counts == {"answered": 3, "rejected": 5}


# ---- the scorer --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fail_on_error", [True, False])
def test_the_scorer_stops_the_run_or_counts_the_failure(capsys, fail_on_error, dataset):
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")[:2]
    rubrics = {s.task: RUBRIC for s in samples}
    with JudgeServer(mode="slow", delay=2) as server:
        scorer = JudgeScorer(settings(server, timeout_s=0.3, max_retries=0), PROTOCOL, rubrics, 2, fail_on_error)
        with scorer:
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


def test_an_unreadable_first_frame_fails_only_its_rollout(tmp_path, dataset):
    """judge_fail_on_error: false: a sample whose first frame cannot be read scores the error score, the others
    are judged; nothing escapes collect()."""
    import shutil

    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")[:2]
    broken = Path(shutil.copytree(samples[0].directory, tmp_path / "broken"))
    (broken / "first_frame.png").write_bytes(b"not a png")
    rubrics = {s.task: RUBRIC for s in samples}
    with JudgeServer() as server:
        with JudgeScorer(settings(server), PROTOCOL, rubrics, 2, False) as scorer:
            futures = [
                scorer.submit(ScoreRequest(rollout(17), s.task, str(d), 16, 0, 5.0, 12, 0.0))
                for s, d in ((samples[0], broken), (samples[1], samples[1].directory))
            ]
            first, second = scorer.collect(futures)
        assert len(server.requests) == 1
    assert first["score"] == 0.0 and "first frame" in first["error"] and not second.get("error")


def test_the_configured_scorer_judges_every_rollout_with_its_tasks_rubric(dataset, repo):
    from videogrpo import config
    from videogrpo.data.dataset import load_split

    samples = load_split(dataset, "rl")
    cfg = config.load([repo / "config/config.yaml"], {"reward": {"kind": "vbvr_vlm", "judge_concurrency": 3}})
    with JudgeServer() as server:
        cfg.reward.judge_endpoint = server.endpoint
        with JudgeScorer.for_config(cfg, sorted({s.task for s in samples})) as scorer:
            videos = [rollout(17, bright_last=i % 2 == 0) for i in range(len(samples))]
            futures = [
                scorer.submit(ScoreRequest(v, s.task, str(s.directory), 16, 0, 5.0, 12, 0.0))
                for s, v in zip(samples, videos)
            ]
            results = scorer.collect(futures)
        assert len(server.requests) == len(samples) and server.counts == {"answered": len(samples)}
        for body, sample in zip(
            sorted(server.requests, key=lambda b: b["messages"][0]["content"][0]["text"]),
            sorted(samples, key=lambda s: RUBRICS[s.task].strip()),
        ):
            assert body["messages"][0]["content"][0]["text"] == RUBRICS[sample.task].strip()
    assert [r["score"] for r in results] == [0.5 if i % 2 == 0 else 0.0 for i in range(len(samples))]


def service_config(tmp_path, command, **reward):
    import socket

    from videogrpo import config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fields = dict(
        dict(kind="vbvr_vlm", judge_port=port, judge_serve_command=command, judge_ready_timeout_s=30), **reward
    )
    return config.from_dict({"reward": fields}, partial=True)


STAND_IN = [sys.executable, "-m", "videogrpo.demo.stand_in_judge", "--port", "{port}", "--name", "{name}"]


def test_the_job_starts_the_judge_service_waits_for_it_and_stops_it(tmp_path):
    from videogrpo.rewards.judge_service import judge_service

    cfg = service_config(tmp_path, [*STAND_IN, "--startup-delay", "1.5", "--tp", "{tensor_parallel}"])
    log = tmp_path / "judge.log"
    with judge_service(cfg, tmp_path / "model", log) as endpoint:
        result = judge(JudgeSettings(endpoint, "qwen3.6-27b"), PROTOCOL, RUBRIC, rollout()[0], rollout())
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


def test_a_dead_judge_endpoint_names_the_field_to_fix(tmp_path):
    from videogrpo.rewards.judge_service import judge_service

    dead = service_config(tmp_path, STAND_IN, judge_ready_timeout_s=1)  # nothing listens on its judge_port
    dead.reward.judge_endpoint = f"http://127.0.0.1:{dead.reward.judge_port}"
    with pytest.raises(VideoGRPOError, match=r"^reward.judge_endpoint = 'http://127.0.0.1:\d+': the judge service"):
        with judge_service(dead, None, tmp_path / "c.log"):
            pass


def test_preflight_asks_an_external_judge_endpoint_as_training_does(dataset, tmp_path):
    """A dead reward.judge_endpoint fails the preflight stage's check with the error training would raise; the
    stand-in judge passes it; a job that starts its own judge on each node has no service to ask at preflight."""
    from videogrpo.preflight.checks import check_judge_endpoint, reward_checks
    from videogrpo.rewards.judge_service import judge_service

    dead = service_config(tmp_path, STAND_IN, judge_ready_timeout_s=1)  # nothing listens on its judge_port
    dead.reward.judge_endpoint = f"http://127.0.0.1:{dead.reward.judge_port}"
    check = check_judge_endpoint(dead)
    with pytest.raises(VideoGRPOError) as training:
        with judge_service(dead, None, tmp_path / "c.log"):
            pass
    assert check.name == "judge_endpoint" and not check.ok and check.detail == str(training.value)
    assert check.detail.startswith(f"reward.judge_endpoint = {dead.reward.judge_endpoint!r}: the judge service at ")
    sources = dict(judge_prompts=str(RUBRIC_FILE), judge_prompts_digest=sha(RUBRIC_FILE))
    sources.update(judge_protocol=str(PROTOCOL_FILE), judge_protocol_digest=sha(PROTOCOL_FILE))
    co_hosted = service_config(tmp_path, STAND_IN, **sources)
    assert [c.name for c in reward_checks(co_hosted, None, dataset)] == ["judge_rubrics"]
    with JudgeServer() as server:
        external = service_config(tmp_path, STAND_IN, judge_endpoint=server.endpoint, **sources)
        checks = reward_checks(external, None, dataset)
        assert [c.name for c in checks] == ["judge_rubrics", "judge_endpoint"] and all(c.ok for c in checks), checks
        assert checks[1].detail == f"{server.endpoint} serves 'qwen3.6-27b'"
        external.reward.judge_served_name = "another-model"
        assert "not reward.judge_served_name = 'another-model'" in check_judge_endpoint(external).detail


def test_a_dead_judge_only_a_gold_reward_needs_warns_and_training_goes_on(tmp_path, capsys):
    """The rule reward trains, the judge is a gold reward: a dead reward.judge_endpoint is a warning at preflight and
    when training starts (each validation point then goes without the judge's numbers, docs/options.md), saying that
    only the gold reward needs the judge; with train.validate_rewards_fail_on_error it stops both, saying so."""
    from videogrpo.preflight.checks import check_judge_endpoint
    from videogrpo.rewards.judge_service import judge_service

    gold = service_config(tmp_path, STAND_IN, kind="vbvr_rule", judge_ready_timeout_s=1)
    gold.reward.judge_endpoint = f"http://127.0.0.1:{gold.reward.judge_port}"
    gold.train.validate_rewards = ["vbvr_vlm"]
    check = check_judge_endpoint(gold)
    assert check.ok and check.detail.startswith("warning: reward.judge_endpoint = "), check
    assert "only the gold reward vbvr_vlm (train.validate_rewards) needs the judge at " in check.detail
    assert "training goes on, and each validation point goes without the judge's numbers" in check.detail
    with judge_service(gold, None, tmp_path / "d.log") as endpoint:
        assert endpoint == gold.reward.judge_endpoint
    assert "[judge] warning: reward.judge_endpoint = " in capsys.readouterr().err
    gold.train.validate_rewards_fail_on_error = True
    check = check_judge_endpoint(gold)
    assert not check.ok and "train.validate_rewards_fail_on_error: true stops on it" in check.detail
    assert "only the gold reward vbvr_vlm (train.validate_rewards) needs the judge" in check.detail
    with pytest.raises(VideoGRPOError, match="only the gold reward vbvr_vlm"):
        with judge_service(gold, None, tmp_path / "e.log"):
            pass


def test_preflight_checks_the_rubric_and_protocol_sources_against_the_dataset(dataset, tmp_path):
    from videogrpo import config
    from videogrpo.preflight.checks import check_judge_rubrics

    def cfg(path, digest, protocol_digest=None):
        protocol_digest = protocol_digest or sha(PROTOCOL_FILE)
        fields = {
            "kind": "vbvr_vlm",
            "judge_prompts": str(path),
            "judge_prompts_digest": digest,
            "judge_protocol": str(PROTOCOL_FILE),
            "judge_protocol_digest": protocol_digest,
        }
        return config.from_dict({"reward": fields}, partial=True)

    ok = check_judge_rubrics(cfg(RUBRIC_FILE, sha(RUBRIC_FILE)), dataset)
    assert ok.ok and "rubrics for all 3 tasks" in ok.detail and "protocol" in ok.detail
    partial = tmp_path / "prompts.py"
    partial.write_text(f"EVAL_PROMPTS = {{{TASK!r}: {RUBRIC!r}}}\n")
    short = check_judge_rubrics(cfg(partial, sha(partial)), dataset)
    assert not short.ok and "no rubric for task(s)" in short.detail and "covers 1 tasks" in short.detail
    edited = check_judge_rubrics(cfg(RUBRIC_FILE, sha(RUBRIC_FILE), "0" * 64), dataset)
    assert not edited.ok and "judge protocol source digest mismatch" in edited.detail
