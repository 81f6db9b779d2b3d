"""A loopback server speaking the OpenAI chat-completions protocol as vLLM serves it, for the VLM judge.

The judge model (27B, on GPUs) cannot run on a laptop or without the Hub; this stands in for it, for the tiny
default and the tests, at the network boundary, over real HTTP:
`GET /v1/models` and `POST /v1/chat/completions` with vLLM's multimodal and structured-output extensions.

It checks a request as vLLM does: 400 for a body vLLM rejects (no messages, a malformed content part, a
structured-output constraint that is not exactly one kind, a regex that does not compile, a bad sampling
value), 404 for a model it does not serve (a request without `model` gets the served one, as vLLM does).
It decodes as vLLM does under `structured_outputs.regex`: its answer always matches the regex, or it
refuses to answer (400; a real server would have been forced into some other text). Without a regex the
"model" rambles in prose, as an unconstrained judge may. The answer follows the rubric (the first text part)
and its "Output format (exactly these lines):" fields; the score depends on the request (the share of bright
pixels of the rollout's last frame; `pays="brightness"`: its mean brightness, a reward built to be gamed;
`pays="constant"`: the same verdict for every video).

`mode` makes it misbehave as real services do, for the first `failures` requests (None: every request):
`429`, `500`, `503`, `400` ... (that HTTP status), `drop` (closes the connection without an answer),
`bad_json` (200 with a body that is not JSON), `slow` (answers after `delay` seconds), `invalid` (answers
within the regex but with weights that do not add up to 100, until the conversation holds `failures`
repair requests). `script` instead gives the outcome of each request in turn (a mode name, `invalid`
regardless of repairs; `good` after its end). Every request body it got is kept in `requests`, and
`counts` counts the outcomes on the server side (the mode's name when it misbehaved, `invalid`, `answered`,
`rejected`). Run as a script, it serves until killed:

    python -m videogrpo.demo.stand_in_judge --port 18080 [--name qwen3.6-27b] [--mode good]
"""

from __future__ import annotations

import argparse
import base64
import collections
import io
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARKER = "Output format (exactly these lines):"
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
STRUCTURED_KEYS = {*CONSTRAINTS, "disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                   "whitespace_pattern"}  # fmt: skip
ROLES = {"system", "user", "assistant", "developer", "tool"}
PARTS = ("text", "image_url", "video_url")


class Rejected(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def video_frames(data_url: str) -> tuple[list, float]:
    import av

    raw = base64.b64decode(data_url.split(",", 1)[1])
    with av.open(io.BytesIO(raw)) as container:
        rate = float(container.streams.video[0].average_rate)
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)], rate


def rubric_fields(rubric: str) -> list[str]:
    """The answer lines the rubric asks for (read here independently of the client's parser)."""
    section = rubric.split(MARKER, 1)[1] if MARKER in rubric else ""
    return [line.split(":", 1)[0] for line in section.splitlines() if re.match(r"[a-z][a-z0-9_]*:", line)]


def answer_for(body: dict, weights_off: int = 0, pays: str = "bright_share") -> str:
    content = body["messages"][0]["content"]
    rubric = next(part["text"] for part in content if part["type"] == "text")
    video = next(part["video_url"]["url"] for part in content if part["type"] == "video_url")
    frames, _ = video_frames(video)
    if pays == "constant":  # the same verdict for every video: a term that carries no signal
        bright = 0.5
    elif pays == "brightness":  # the last frame's mean brightness, 20 x its distance from mid-grey: built to be gamed
        bright = min(1.0, max(0.0, 0.5 + 20 * (float(frames[-1].mean()) / 255.0 - 0.5)))
    else:
        bright = float((frames[-1].mean(axis=-1) > 100).mean())
    total = round(100 * bright)
    fields = rubric_fields(rubric)
    weights = [f for f in fields if f.endswith("_weight")]
    shares = [100 // len(weights)] * len(weights) if weights else []
    if shares:
        shares[0] += 100 - sum(shares) - weights_off
    lines = []
    for field in fields:
        if field == "reason":
            lines.append(f"reason: the last frame is {100 * bright:.0f}% bright.")
        elif field in weights:
            lines.append(f"{field}: {shares[weights.index(field)]}")
        else:
            lines.append(f"{field}: {total}")
    return "\n".join(lines)


def check_request(body, served: str) -> None:
    """Raise Rejected where vLLM would refuse the body."""
    if not isinstance(body, dict):
        raise Rejected(400, "the request body must be a JSON object")
    model = body.get("model", served)
    if model != served:
        raise Rejected(404, f"The model `{model}` does not exist.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejected(400, "messages: a non-empty list is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise Rejected(400, f"messages[{i}]: a message needs a role in {sorted(ROLES)}")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise Rejected(400, f"messages[{i}].content: a string or a list of parts")
        for j, part in enumerate(content):
            key = part.get("type") if isinstance(part, dict) and part.get("type") in PARTS else None
            value = part.get(key) if key else None
            ok = (
                isinstance(value, str)
                if key == "text"
                else isinstance(value, dict) and isinstance(value.get("url"), str)
            )
            if not ok:
                raise Rejected(400, f"messages[{i}].content[{j}]: not a valid text, image_url or video_url part")
    if not isinstance(body.get("temperature", 1.0), (int, float)) or body.get("temperature", 1.0) < 0:
        raise Rejected(400, "temperature must be a number >= 0")
    if not isinstance(body.get("max_tokens", 1), int) or body.get("max_tokens", 1) < 1:
        raise Rejected(400, "max_tokens must be an integer >= 1")
    structured = body.get("structured_outputs")
    if structured is None:
        return
    if not isinstance(structured, dict) or set(structured) - STRUCTURED_KEYS:
        raise Rejected(400, f"structured_outputs: unknown fields {sorted(set(structured or {}) - STRUCTURED_KEYS)}")
    kinds = [k for k in CONSTRAINTS if structured.get(k) is not None]
    if len(kinds) != 1:
        raise Rejected(400, f"structured_outputs: exactly one kind of constraint is allowed, got {kinds}")
    if "regex" in kinds:
        try:
            re.compile(structured["regex"])
        except (re.error, TypeError) as err:
            raise Rejected(400, f"structured_outputs.regex is not a valid regex: {err}") from None


class JudgeHandler(BaseHTTPRequestHandler):
    name = "qwen3.6-27b"
    mode = "good"
    delay = 0.0
    failures: int | None = None
    script: list[str] | None = None
    requests: list[dict] = []
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}.get(status, "InternalServerError")
        self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}")
            return
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self.lock:
            self.requests.append(body)
            number = len(self.requests)
        if self.script is not None:
            mode = self.script[number - 1] if number <= len(self.script) else "good"
        else:
            mode = self.mode if self.failures is None or number <= self.failures else "good"
        if mode not in ("good", "invalid"):
            self.counts[mode] += 1
            if mode.isdigit():
                self._error(int(mode), f"stand-in {mode}")
                return
            if mode == "drop":
                self.close_connection = True
                return
            if mode == "bad_json":
                self._send(200, b"<html><body>502 Bad Gateway</body></html>")
                return
            time.sleep(self.delay)  # slow
        try:
            check_request(body, self.name)
        except Rejected as err:
            self.counts["rejected"] += 1
            self._error(err.status, str(err))
            return
        first = body["messages"][0]["content"]
        if not isinstance(first, list) or not any(p["type"] == "video_url" for p in first):
            self.counts["rejected"] += 1
            self._error(400, "stand-in: the first message must hold the rubric and a video_url part")
            return
        regex = (body.get("structured_outputs") or {}).get("regex")
        repairs = sum(m["role"] == "assistant" for m in body["messages"])
        if self.script is not None:
            invalid = mode == "invalid"
        else:
            invalid = self.mode == "invalid" and (self.failures is None or repairs < self.failures)
        if regex is None:
            text = "The video looks plausible to me; the square seems to move."
        else:
            text = answer_for(body, weights_off=10 if invalid else 0, pays=self.pays)
            if not re.fullmatch(regex, text):
                self.counts["rejected"] += 1
                self._error(400, f"stand-in: the answer the rubric asks for does not match the regex: {text!r}")
                return
        self.counts["invalid" if invalid else "answered"] += 1
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        self._json(200, {"id": f"chatcmpl-{number}", "object": "chat.completion", "model": self.name,
                         "choices": [choice]})  # fmt: skip


class JudgeServer:
    """`with JudgeServer(mode=...) as server:` serves at server.endpoint until the block ends."""

    def __init__(self, mode="good", name="qwen3.6-27b", delay=0.0, failures=None, script=None, port=0,
                 pays="bright_share"):  # fmt: skip
        attrs = {"mode": mode, "name": name, "delay": delay, "failures": failures, "script": script, "requests": [],
                 "counts": collections.Counter(), "lock": threading.Lock(), "pays": pays}  # fmt: skip
        self.handler = type("Handler", (JudgeHandler,), attrs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self.handler)
        self.httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def requests(self) -> list[dict]:
        return self.handler.requests

    @property
    def counts(self) -> collections.Counter:
        return self.handler.counts

    def __enter__(self) -> JudgeServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="qwen3.6-27b")
    parser.add_argument("--mode", default="good", help="good, slow, drop, bad_json, invalid, or an HTTP status")
    parser.add_argument("--failures", type=int, default=None, help="misbehave for this many requests (default all)")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds before it listens (loading)")
    args, _ = parser.parse_known_args()  # a serve command may pass vLLM's other options: ignored here
    time.sleep(args.startup_delay)
    server = JudgeServer(args.mode, args.name, failures=args.failures, port=args.port)
    print(f"judge stand-in serving {args.name} at {server.endpoint}", flush=True)
    server.httpd.serve_forever()
