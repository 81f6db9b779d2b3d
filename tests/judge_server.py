"""A loopback server speaking the OpenAI chat-completions protocol as vLLM serves it, for the VLM judge.

The judge model cannot run here; this stands in for it at the network boundary, over real HTTP:
`GET /v1/models` and `POST /v1/chat/completions` with vLLM's multimodal extensions. Its answer
depends on the request (the fraction of bright pixels of the rollout's last frame), and `mode` makes
it misbehave as real services do: `slow` (answers after `delay` seconds), `failing` (HTTP 500 for the
first `failures` requests), `malformed` (an answer without the required lines until asked to repair it).
Every request body it got is kept in `requests`. Run as a script, it serves until killed:

    python tests/judge_server.py --port 18080 --name qwen3.6-27b [--mode good]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def video_frames(data_url: str) -> tuple[list, float]:
    import av

    raw = base64.b64decode(data_url.split(",", 1)[1])
    with av.open(io.BytesIO(raw)) as container:
        rate = float(container.streams.video[0].average_rate)
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)], rate


def answer_for(body: dict) -> str:
    content = body["messages"][0]["content"]
    video = next(part["video_url"]["url"] for part in content if part["type"] == "video_url")
    frames, _ = video_frames(video)
    bright = float((frames[-1].mean(axis=-1) > 100).mean())
    total = round(100 * bright)
    return (
        f"goal_score: {total}\nquality_score: 50\ngoal_weight: 70\nquality_weight: 30\n"
        f"total_score: {total}\nreason: the last frame is {100 * bright:.0f}% bright."
    )


class JudgeHandler(BaseHTTPRequestHandler):
    name = "qwen3.6-27b"
    mode = "good"
    delay = 0.0
    failures = 0
    requests: list[dict] = []
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.requests.append(body)
            count = len(self.requests)
        if body.get("model") != self.name:
            self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            return
        if self.mode == "failing" and count <= self.failures:
            self._json(500, {"error": {"message": "Internal Server Error"}})
            return
        if self.mode == "slow":
            time.sleep(self.delay)
        repairing = len(body["messages"]) > 1
        text = "Looks plausible to me." if self.mode == "malformed" and not repairing else answer_for(body)
        self._json(
            200,
            {
                "id": f"chatcmpl-{count}",
                "object": "chat.completion",
                "model": self.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            },
        )


class JudgeServer:
    """`with JudgeServer(mode=...) as server:` serves at server.endpoint until the block ends."""

    def __init__(self, mode: str = "good", name: str = "qwen3.6-27b", delay: float = 0.0, failures: int = 0, port=0):
        attrs = {"mode": mode, "name": name, "delay": delay, "failures": failures, "requests": []}
        self.handler = type("Handler", (JudgeHandler,), attrs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self.handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def requests(self) -> list[dict]:
        return self.handler.requests

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
    parser.add_argument("--mode", default="good", choices=["good", "slow", "failing", "malformed"])
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds before it listens (loading)")
    args, _ = parser.parse_known_args()  # a serve command may pass vLLM's other options: ignored here
    time.sleep(args.startup_delay)
    server = JudgeServer(args.mode, args.name, port=args.port)
    print(f"judge stand-in serving {args.name} at {server.endpoint}", flush=True)
    server.httpd.serve_forever()
