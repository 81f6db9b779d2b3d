"""A loopback server speaking the part of the Hugging Face Hub HTTP API that snapshot_download uses.

The Hub is unreachable from the test machines; huggingface_hub's own client talks to this instead
(HF_ENDPOINT), over real HTTP: the recursive tree listing (`/api/{type}s/{repo}/tree/{rev}`) and file
resolution (`HEAD`/`GET` `/{repo}/resolve/{rev}/{path}`, `/datasets/...` for datasets) with the headers
the client reads (X-Repo-Commit, ETag, Content-Length, X-Error-Code) and byte ranges for resumption.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

# (repo type, repo id) -> {commit: {path: bytes}}
Repos = dict[tuple[str, str], dict[str, dict[str, bytes]]]

TREE = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


class HubHandler(BaseHTTPRequestHandler):
    repos: Repos = {}
    requests: list[str] = []

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _files(self, repo_type: str, repo_id: str, revision: str) -> dict[str, bytes] | None:
        commits = self.repos.get((repo_type, repo_id))
        if commits is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if revision not in commits:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return commits[revision]

    def do_GET(self) -> None:
        self.requests.append(f"{self.command} {self.path}")
        url = urlparse(self.path)
        path = unquote(url.path)
        if match := TREE.match(path):
            kind, repo_id, revision, prefix = match.groups()
            files = self._files(kind[:-1], repo_id, revision)
            if files is None:
                return
            entries = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in sorted(files.items())
                if not prefix or name.startswith(prefix + "/")
            ]
            body = json.dumps(entries).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if match := RESOLVE.match(path):
            dataset, repo_id, revision, name = match.groups()
            files = self._files("dataset" if dataset else "model", repo_id, revision)
            if files is None:
                return
            if name not in files:
                self._error(404, "EntryNotFound", f"{name} not found at {revision}")
                return
            data = files[name]
            start = 0
            if (rng := self.headers.get("Range")) and (m := re.match(r"bytes=(\d+)-$", rng)):
                start = int(m.group(1))
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", revision)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data[start:])
            return
        self._error(404, "NotFound", f"no route for {path}")

    do_HEAD = do_GET


class HubServer:
    """`with HubServer(repos) as hub:` serves `repos` at hub.endpoint until the block ends."""

    def __init__(self, repos: Repos):
        handler = type("Handler", (HubHandler,), {"repos": repos, "requests": []})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.handler = handler
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> HubServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def requests(self) -> list[str]:
        return self.handler.requests
