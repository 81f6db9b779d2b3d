"""The VLM judge reward (REFERENCE section 3): an OpenAI-compatible chat-completions endpoint scores rollouts.

Per rollout one request: the task's rubric, the first frame as a JPEG data URL (longest edge 512, quality
85) and the whole rollout as an in-memory H.264 MP4 data URL; the server samples 32 frames itself. The
answer must hold `<aspect>_score` and `<aspect>_weight` lines (0-100, weights summing to 100),
`total_score` and `reason`; an invalid answer is sent back with a repair message, a failed request is
retried with exponential backoff, and what still fails scores `reward.judge_error_score` with its error
(evalkit-style: `fail_on_error` decides whether that stops the run). Requests run in threads: the work
is waiting on the server.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import re
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo.errors import ConfigError, DigestMismatch, VideoGRPOError
from videogrpo.rewards.rule import warn_once

REPAIR_CHARS = 300
_LINE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*(.*?)\s*$")


class JudgeAnswerError(ValueError):
    """The judge's answer breaks the required format; the message goes back to it as a repair request."""


class JudgeError(VideoGRPOError):
    """A rollout the judge could not score while reward.judge_fail_on_error is true."""


def load_rubrics(path: str | Path, expected_sha256: str, tasks: list[str] | None = None) -> dict[str, str]:
    """EVAL_PROMPTS of the pinned prompt source (a Python module), checked by the plain SHA-256 of the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"reward.judge_prompts = {str(path)!r}: no such file; point it at the rubric module")
    data = path.read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != expected_sha256:
        raise DigestMismatch(
            f"{path}: rubric source digest mismatch\n  expected {expected_sha256} (reward.judge_prompts_digest)\n"
            f"  found    {found}\nRestore the file, or pin the new digest (a new scorer contract: a new run)."
        )
    namespace: dict = {}
    exec(compile(data, str(path), "exec"), namespace)  # noqa: S102 - pinned by digest above, like the EvalKit
    rubrics = namespace.get("EVAL_PROMPTS")
    if not isinstance(rubrics, dict):
        raise ConfigError(f"{path}: defines no dict EVAL_PROMPTS (task name -> rubric text)")
    missing = [t for t in tasks or [] if t not in rubrics]
    if missing:
        raise ConfigError(
            f"{path}: no rubric for task(s) {missing}; the source covers {len(rubrics)} tasks "
            f"(e.g. {sorted(rubrics)[:3]}): use the prompt source for this dataset"
        )
    return rubrics


def parse_answer(text: str) -> dict:
    """Validate a judge answer: every aspect scored and weighted 0-100, weights summing to 100, a total and a
    reason. Returns {"score": total / 100, "aspects": {aspect: (score, weight)}, "reason"}."""
    fields: dict[str, str] = {}
    for line in text.strip().splitlines():
        if m := _LINE.match(line):
            fields.setdefault(m.group(1).lower(), m.group(2))

    def number(key: str) -> float:
        try:
            value = float(fields[key])
        except KeyError:
            raise JudgeAnswerError(f"missing line `{key}: <0-100>`") from None
        except ValueError:
            raise JudgeAnswerError(f"`{key}` is {fields[key]!r}, not a number") from None
        if not (math.isfinite(value) and 0 <= value <= 100):
            raise JudgeAnswerError(f"`{key}` is {fields[key]}, outside 0-100")
        return value

    aspects = sorted(k[: -len("_score")] for k in fields if k.endswith("_score") and k != "total_score")
    weighted = sorted(k[: -len("_weight")] for k in fields if k.endswith("_weight"))
    if not aspects:
        raise JudgeAnswerError("no `<aspect>_score` lines")
    if aspects != weighted:
        raise JudgeAnswerError(f"aspects scored {aspects} differ from aspects weighted {weighted}")
    scores = {a: (number(f"{a}_score"), number(f"{a}_weight")) for a in aspects}
    total_weight = sum(w for _, w in scores.values())
    if abs(total_weight - 100) > 1e-6:
        raise JudgeAnswerError(f"the weights sum to {total_weight:g}, not 100")
    total = number("total_score")
    reason = fields.get("reason", "").strip()
    if not reason:
        raise JudgeAnswerError("missing line `reason: <1-2 sentences>`")
    return {"score": total / 100.0, "aspects": scores, "reason": reason}


def jpeg_data_url(image: np.ndarray, longest_edge: int = 512, quality: int = 85) -> str:
    from PIL import Image

    picture = Image.fromarray(image)
    scale = longest_edge / max(picture.size)
    if scale < 1:
        picture = picture.resize(
            (max(1, round(picture.width * scale)), max(1, round(picture.height * scale))), Image.Resampling.LANCZOS
        )
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def mp4_data_url(frames: np.ndarray, fps: int) -> str:
    from videogrpo.data.video import write_mp4

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rollout.mp4")
        even = frames[:, : frames.shape[1] // 2 * 2, : frames.shape[2] // 2 * 2]  # H.264 needs even sides
        write_mp4(path, even, fps=fps, crf=18)
        return "data:video/mp4;base64," + base64.b64encode(Path(path).read_bytes()).decode()


@dataclass(frozen=True)
class JudgeSettings:
    endpoint: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:18080."""
    model: str
    """Served model name."""
    frames: int = 32
    timeout_s: float = 300.0
    max_retries: int = 2
    backoff_s: float = 1.0
    error_score: float = 0.0
    fps: int = 16


def request_body(settings: JudgeSettings, rubric: str, first_frame: np.ndarray, frames: np.ndarray) -> dict:
    content = [
        {"type": "text", "text": rubric},
        {"type": "image_url", "image_url": {"url": jpeg_data_url(first_frame)}},
        {"type": "video_url", "video_url": {"url": mp4_data_url(frames, settings.fps)}},
    ]
    return {
        "model": settings.model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "seed": 0,
        "max_tokens": 1024,
        "chat_template_kwargs": {"enable_thinking": False},
        "media_io_kwargs": {"video": {"video_backend": "opencv", "num_frames": settings.frames, "fps": -1}},
        "mm_processor_kwargs": {"do_sample_frames": False},
    }


def _post(settings: JudgeSettings, body: dict) -> str:
    request = urllib.request.Request(
        settings.endpoint.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=settings.timeout_s) as response:
        reply = json.loads(response.read())
    try:
        return reply["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise JudgeAnswerError(f"the reply has no choices[0].message.content: {json.dumps(reply)[:200]}") from None


def judge(settings: JudgeSettings, rubric: str, first_frame: np.ndarray, frames: np.ndarray, sleep=time.sleep) -> dict:
    """Score one rollout: {"score", "dimensions", "reason"} or, after every retry failed, the error score with
    "error". A transport failure is retried; an invalid answer is repaired within the same conversation."""
    body = request_body(settings, rubric, first_frame, frames)
    last = "no attempt"
    for attempt in range(settings.max_retries + 1):
        if attempt:
            sleep(settings.backoff_s * 2 ** (attempt - 1))
        try:
            answer = _post(settings, body)
        except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as err:
            last = f"request failed: {getattr(err, 'reason', err)}"
            continue
        except JudgeAnswerError as err:
            last = str(err)
            continue
        try:
            parsed = parse_answer(answer)
        except JudgeAnswerError as err:
            last = f"invalid answer: {err}"
            body["messages"] = body["messages"] + [
                {"role": "assistant", "content": answer},
                {
                    "role": "user",
                    "content": f"Your answer is invalid: {str(err)[:REPAIR_CHARS]}. Answer again with exactly the "
                    f"requested lines: <aspect>_score, <aspect>_weight (weights sum to 100), total_score, reason.",
                },
            ]
            continue
        dims = {f"{a}_score": s for a, (s, _) in parsed["aspects"].items()}
        return {"score": parsed["score"], "dimensions": dims, "reason": parsed["reason"], "attempts": attempt + 1}
    return {
        "score": settings.error_score,
        "dimensions": {},
        "error": f"judge gave up after {attempt + 1} attempts: {last}",
    }


class JudgeScorer:
    """Submit rollouts now, collect scores later: RuleScorer's interface, over a judge endpoint."""

    def __init__(self, settings: JudgeSettings, rubrics: dict[str, str], concurrency: int, fail_on_error: bool):
        self.settings, self.rubrics, self.fail_on_error = settings, rubrics, fail_on_error
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="judge")
        self.warned: set[str] = set()

    @classmethod
    def for_config(cls, cfg, tasks: list[str]) -> JudgeScorer:
        """The judge the `reward` section describes: its endpoint, or the service on this node's judge_port."""
        r = cfg.reward
        settings = JudgeSettings(
            endpoint=endpoint_of(cfg),
            model=r.judge_served_name,
            frames=r.judge_frames,
            timeout_s=r.judge_timeout_s,
            max_retries=r.judge_max_retries,
            error_score=r.judge_error_score,
            fps=cfg.video.fps,
        )
        rubrics = load_rubrics(r.judge_prompts, r.judge_prompts_digest, tasks)
        return cls(settings, rubrics, r.judge_concurrency, r.judge_fail_on_error)

    def submit(self, request) -> Future:
        """`request`: a rule.ScoreRequest (frames, task, sample directory)."""
        from PIL import Image

        if request.task not in self.rubrics:
            raise ConfigError(f"no rubric for task {request.task!r} in the judge prompt source")
        with Image.open(Path(request.sample_dir) / "first_frame.png") as image:
            first = np.asarray(image.convert("RGB"))
        rubric = self.rubrics[request.task]

        def run() -> dict:
            result = judge(self.settings, rubric, first, request.frames)
            return dict(result, task=request.task, sample=request.sample_dir)

        return self.pool.submit(run)

    def collect(self, futures: list[Future]) -> list[dict]:
        results = [f.result() for f in futures]
        for r in results:
            if not r.get("error"):
                continue
            if self.fail_on_error:
                raise JudgeError(
                    f"the judge could not score task {r['task']} ({r['sample']}): {r['error']}\n"
                    f"reward.judge_fail_on_error is true: check the judge service, or set it false to score such "
                    f"rollouts reward.judge_error_score (counted in reward_errors)."
                )
            warn_once(
                self.warned,
                r["task"],
                f"judge failed on task {r['task']} ({r['error']}); scored {self.settings.error_score}, counted in "
                f"reward_errors",
            )
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> JudgeScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def endpoint_of(cfg) -> str:
    return cfg.reward.judge_endpoint or f"http://127.0.0.1:{cfg.reward.judge_port}"


def wait_ready(endpoint: str, timeout_s: float, process=None) -> list[str]:
    """Poll GET /v1/models until the service answers; the served model names. Fails early if `process` died."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise VideoGRPOError(f"the judge service exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(endpoint.rstrip("/") + "/v1/models", timeout=5) as response:
                return [m["id"] for m in json.loads(response.read()).get("data", [])]
        except (urllib.error.URLError, OSError, ValueError) as err:
            last = str(getattr(err, "reason", err))
        time.sleep(1.0)
    raise VideoGRPOError(f"the judge service at {endpoint} was not ready after {timeout_s:g} s ({last})")
