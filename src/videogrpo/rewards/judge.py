"""The VLM judge reward (docs/reference-system.md#vlm-judge): an OpenAI-compatible chat-completions endpoint scores
rollouts.

Per rollout one conversation: the request `judge_protocol.request_body` builds (rubric, first frame, the whole
rollout as an MP4, the reminder, the rubric's regex); its answer is validated against the rubric's fields and,
if invalid, repaired in the same conversation. Two nested budgets, both `reward.judge_max_retries`: repairs
of an invalid answer, and within each request the retries of transport failures (HTTP 429 and 5xx, connection
errors, timeouts, a reply that is not JSON), backoff 1 s x 2^attempt for both. Other HTTP errors (400, 404)
fail at once. What still fails scores `reward.judge_error_score` with its error (evalkit-style:
`fail_on_error` decides whether that stops the run). Requests run in threads: the work is waiting on the server.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo.errors import ConfigError, VideoGRPOError
from videogrpo.rewards.judge_protocol import (
    JudgeAnswerError,
    Protocol,
    load_protocol,
    load_rubrics,
    output_fields,
    repair_text,
    request_body,
    validate_answer,
)
from videogrpo.rewards.request import warn_once

__all__ = ["JudgeAnswerError", "JudgeError", "JudgeScorer", "JudgeSettings", "judge", "load_protocol", "load_rubrics"]
BODY_EXCERPT = 1000
"""Characters of an HTTP error's body quoted in the rollout's error."""
# A proxy from the environment must never carry loopback judge traffic.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class JudgeError(VideoGRPOError):
    """A rollout the judge could not score while reward.judge_fail_on_error is true."""


class JudgeRequestError(Exception):
    """A request that failed for good: a non-retryable HTTP status, retries spent, or a reply without an answer."""


@dataclass(frozen=True)
class JudgeSettings:
    endpoint: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:18080."""
    model: str
    """Served model name."""
    frames: int = 32
    """Frames the server samples from the MP4."""
    timeout_s: float = 300.0
    max_retries: int = 2
    backoff_s: float = 1.0
    error_score: float = 0.0
    fps: int = 16
    """Frame rate of the rollout MP4."""


def _retryable(status: int) -> bool:
    return status == 429 or 500 <= status < 600


def complete(settings: JudgeSettings, body: dict, sleep=time.sleep) -> tuple[str, int]:
    """POST one chat completion, retrying transport failures; (the answer text, requests made)."""
    url = settings.endpoint.rstrip("/") + "/v1/chat/completions"
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    for attempt in range(settings.max_retries + 1):
        request, raw = urllib.request.Request(url, data=data, headers=headers, method="POST"), b""
        try:
            with _OPENER.open(request, timeout=settings.timeout_s) as response:
                raw = response.read()
            reply = json.loads(raw.decode("utf-8"))
            break
        except urllib.error.HTTPError as err:
            try:  # the body of an error answer can be cut short too: that is still this request's failure
                excerpt = err.read().decode("utf-8", errors="replace")[:BODY_EXCERPT]
            except (OSError, http.client.HTTPException) as unread:
                excerpt = f"(its body could not be read: {type(unread).__name__}: {unread})"
            failure = f"HTTP {err.code} from {url}: {excerpt}"
            if not _retryable(err.code):
                raise JudgeRequestError(f"{failure} (not retried: only 429 and 5xx are)") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as err:
            cause = getattr(err, "reason", err)
            failure = f"request to {url} failed: {type(cause).__name__}: {cause}"
        except ValueError as err:  # the body is not (UTF-8) JSON
            failure = f"{url} replied with something that is not JSON ({err}): {raw[:200]!r}"
        if attempt == settings.max_retries:
            raise JudgeRequestError(f"{failure} (after {attempt + 1} requests)")
        sleep(settings.backoff_s * 2**attempt)
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeRequestError(f"the reply has no choices[0].message.content: {json.dumps(reply)[:200]}") from None
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    if not isinstance(content, str) or not content.strip():
        raise JudgeRequestError(f"the judge returned an empty answer: {json.dumps(reply)[:200]}")
    return content.strip(), attempt + 1


def judge(
    settings: JudgeSettings,
    protocol: Protocol,
    rubric: str,
    first_frame: np.ndarray,
    frames: np.ndarray,
    sleep=time.sleep,
) -> dict:
    """Score one rollout: {"score", "dimensions", "reason", "requests", "repairs"}, or the error score with
    "error" once the request failed for good or the answer was still invalid after max_retries repairs."""
    requests = 0
    try:
        fields = output_fields(rubric)
        body = request_body(settings.model, protocol, rubric, first_frame, frames, settings.fps, settings.frames)
        for repair in range(settings.max_retries + 1):
            answer, made = complete(settings, body, sleep)
            requests += made
            try:
                verdict = validate_answer(answer, fields)
            except JudgeAnswerError as err:
                if repair == settings.max_retries:
                    raise JudgeRequestError(f"invalid answer after {repair} repairs: {err}") from None
                body = dict(
                    body,
                    messages=[
                        *body["messages"],
                        {"role": "assistant", "content": answer},
                        {"role": "user", "content": repair_text(protocol, str(err))},
                    ],
                )
                sleep(settings.backoff_s * 2**repair)
                continue
            dims = {name: value for name, value in verdict.values.items() if name != "total_score"}
            return dict(score=verdict.score, dimensions=dims, reason=verdict.reason, requests=requests, repairs=repair)
    except (JudgeRequestError, ValueError) as err:  # ValueError: a rubric or a rollout the protocol cannot send
        return {"score": settings.error_score, "dimensions": {}, "error": str(err)}
    raise AssertionError("unreachable: the last repair returns or raises")


class JudgeScorer:
    """Submit rollouts now, collect scores later: RuleScorer's interface, over a judge endpoint."""

    def __init__(
        self,
        settings: JudgeSettings,
        protocol: Protocol,
        rubrics: dict[str, str],
        concurrency: int,
        fail_on_error: bool,
    ):
        self.settings, self.protocol, self.rubrics, self.fail_on_error = settings, protocol, rubrics, fail_on_error
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="judge")
        self.warned: set[str] = set()

    @classmethod
    def for_config(cls, cfg, tasks: list[str], fail_on_error: bool | None = None) -> JudgeScorer:
        """The judge the `reward` section describes: its endpoint, or the service on this node's judge_port
        (`fail_on_error` overrides reward.judge_fail_on_error)."""
        r = cfg.reward
        settings = JudgeSettings(
            endpoint=endpoint_of(cfg),
            model=r.judge_served_name,
            frames=r.judge_frames,
            timeout_s=r.judge_timeout_s,
            max_retries=r.judge_max_retries,
            error_score=r.judge_error_score,
            fps=r.judge_fps,
        )
        protocol = load_protocol(r.judge_protocol, r.judge_protocol_digest)
        rubrics = load_rubrics(r.judge_prompts, r.judge_prompts_digest, tasks)
        fail = r.judge_fail_on_error if fail_on_error is None else fail_on_error
        return cls(settings, protocol, rubrics, r.judge_concurrency, fail)

    def submit(self, request) -> Future:
        """`request`: a request.ScoreRequest (frames, task, sample directory)."""
        from PIL import Image

        if request.task not in self.rubrics:
            raise ConfigError(f"no rubric for task {request.task!r} in the judge prompt source")
        rubric = self.rubrics[request.task]

        def run() -> dict:
            # Read here, not in the driver: an unreadable first frame fails this rollout (judge_fail_on_error
            # decides), as any other failure to score it does.
            try:
                with Image.open(Path(request.sample_dir) / "first_frame.png") as image:
                    first = np.asarray(image.convert("RGB"))
            except OSError as err:
                result = {"score": self.settings.error_score, "dimensions": {}, "error": f"first frame: {err}"}
            else:
                result = judge(self.settings, self.protocol, rubric, first, request.frames)
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

    def close(self, kill: bool = False) -> None:
        """Queued requests are cancelled; running ones are waited for (`kill`: not waited for)."""
        self.pool.shutdown(wait=not kill, cancel_futures=True)

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
            with _OPENER.open(endpoint.rstrip("/") + "/v1/models", timeout=5) as response:
                return [m["id"] for m in json.loads(response.read()).get("data", [])]
        except (urllib.error.URLError, OSError, ValueError) as err:
            last = str(getattr(err, "reason", err))
        time.sleep(1.0)
    raise VideoGRPOError(f"the judge service at {endpoint} was not ready after {timeout_s:g} s ({last})")
