"""A loopback server speaking the part of the Hugging Face Hub HTTP API that snapshot_download uses.

The Hub is unreachable from the test machines; huggingface_hub's own client talks to this instead
(HF_ENDPOINT), over real HTTP: the recursive tree listing (`/api/{type}s/{repo}/tree/{rev}`) and file
resolution (`HEAD`/`GET` `/{repo}/resolve/{rev}/{path}`, `/datasets/...` for datasets) with the headers
the client reads (X-Repo-Commit, ETag, Content-Length, X-Error-Code) and byte ranges for resumption.

Large files are served as the Hub serves them: stored in LFS, listed with `lfs: {oid (SHA-256), size,
pointerSize}` and the git oid of their pointer file, and resolved by a 302 redirect to an absolute
storage URL (`/lfs-cdn/<sha256>` here) with `X-Linked-Etag`/`X-Linked-Size`; small text files are plain
git blobs whose ETag is the blob id. `throttle` (bytes per second) slows storage downloads so a test can
interrupt one; `corrupt` names files whose served bytes differ from what the listing promises.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

# (repo type, repo id) -> {commit: {path: bytes}}
Repos = dict[tuple[str, str], dict[str, dict[str, bytes]]]

TREE = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


LFS_SUFFIXES = (".safetensors", ".bin", ".gz", ".pt", ".pth", ".mp4", ".png")
LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub refuses larger plain git blobs


def is_lfs(name: str, data: bytes) -> bool:
    return name.endswith(LFS_SUFFIXES) or len(data) >= LFS_THRESHOLD


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    oid = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


class HubHandler(BaseHTTPRequestHandler):
    repos: Repos = {}
    requests: list[str] = []
    throttle: int = 0
    corrupt: set[str] = set()
    storage: str = ""  # another origin, as the Hub's storage is another host: clients do not follow it on HEAD

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
            entries = []
            for name, data in sorted(files.items()):
                if prefix and not name.startswith(prefix + "/"):
                    continue
                entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
                if is_lfs(name, data):
                    pointer = lfs_pointer(data)
                    entry["oid"] = git_blob_id(pointer)
                    entry["lfs"] = {
                        "oid": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": len(pointer),
                    }
                entries.append(entry)
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
            if is_lfs(name, data):
                sha = hashlib.sha256(data).hexdigest()
                self.send_response(302)
                self.send_header("X-Repo-Commit", revision)
                self.send_header("ETag", f'"{git_blob_id(lfs_pointer(data))}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Location", f"{self.storage}/lfs-cdn/{sha}?repo={repo_id}&file={name}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send_bytes(data, {"X-Repo-Commit": revision, "ETag": f'"{git_blob_id(data)}"'})
            return
        if path.startswith("/lfs-cdn/"):
            sha = path.rsplit("/", 1)[1]
            found = [(n, d) for commits in self.repos.values() for fs in commits.values() for n, d in fs.items()]
            match = next(((n, d) for n, d in found if hashlib.sha256(d).hexdigest() == sha), None)
            if match is None:
                self._error(404, "EntryNotFound", f"no object {sha}")
                return
            name, data = match
            if name in self.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            self._send_bytes(data, {"ETag": f'"{sha}"'}, throttle=self.throttle)
            return
        self._error(404, "NotFound", f"no route for {path}")

    do_HEAD = do_GET

    def _send_bytes(self, data: bytes, headers: dict[str, str], throttle: int = 0) -> None:
        start = 0
        if (rng := self.headers.get("Range")) and (m := re.match(r"bytes=(\d+)-$", rng)):
            start = int(m.group(1))
            self.requests.append(f"RANGE {start} {self.path}")
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        step = max(1, throttle // 20) if throttle else len(data)
        try:
            for offset in range(start, len(data), step):
                self.wfile.write(data[offset : offset + step])
                if throttle:
                    time.sleep(step / throttle)
        except (BrokenPipeError, ConnectionResetError):  # the client was killed mid-download
            pass


class HubServer:
    """`with HubServer(repos) as hub:` serves `repos` at hub.endpoint until the block ends."""

    def __init__(self, repos: Repos, throttle: int = 0, corrupt: set[str] | None = None):
        attrs = {"repos": repos, "requests": [], "throttle": throttle, "corrupt": corrupt or set()}
        handler = type("Handler", (HubHandler,), attrs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.storage_httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.handler = handler
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        handler.storage = f"http://127.0.0.1:{self.storage_httpd.server_address[1]}"

    def __enter__(self) -> HubServer:
        for httpd in (self.httpd, self.storage_httpd):
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for httpd in (self.httpd, self.storage_httpd):
            httpd.shutdown()
            httpd.server_close()

    @property
    def requests(self) -> list[str]:
        return self.handler.requests
