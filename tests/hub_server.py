"""A loopback server speaking the part of the Hugging Face Hub HTTP API that snapshot_download uses.

The Hub is unreachable from the test machines; huggingface_hub's own client talks to this instead
(HF_ENDPOINT), over real HTTP: the recursive tree listing (`/api/{type}s/{repo}/tree/{rev}`) and file
resolution (`HEAD`/`GET` `/{repo}/resolve/{rev}/{path}`, `/datasets/...` for datasets, `/kernels/...` for
kernel repositories, the Hub's repository type of the `kernels` package) with the headers
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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

# (repo type, repo id) -> {commit: {path: bytes}}
Repos = dict[tuple[str, str], dict[str, dict[str, bytes]]]

TREE = re.compile(r"^/api/(models|datasets|kernels)/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
RESOLVE = re.compile(r"^/(datasets/|kernels/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


LFS_SUFFIXES = (".safetensors", ".bin", ".gz", ".pt", ".pth", ".mp4", ".png", ".so")
LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub refuses larger plain git blobs


def is_lfs(name: str, data: bytes) -> bool:
    return name.endswith(LFS_SUFFIXES) or len(data) >= LFS_THRESHOLD


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes, oid: str | None = None) -> bytes:
    """The LFS pointer file of `data` (`oid`: its SHA-256, when already known)."""
    oid = oid or hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()


def signature(sha: str, repo_id: str) -> str:
    """What the storage accepts for object `sha` of `repo_id` (the Hub's redirects carry it)."""
    return hashlib.sha256(f"loopback-storage-key/{repo_id}/{sha}".encode()).hexdigest()[:32]


@dataclass
class Request:
    """One request as the server saw it."""

    origin: str  # "hub" or "storage"
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    repo: tuple[str, str] | None = None  # (repo type, repo id) of a Hub route
    extra: dict = field(default_factory=dict)

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


class HubHandler(BaseHTTPRequestHandler):
    repos: Repos = {}
    requests: list[str] = []
    log: list[Request] = []
    throttle: int = 0
    corrupt: set[str] = set()
    short: set[str] = set()
    gated: dict[tuple[str, str], str] = {}
    storage: str = ""  # another origin, as the Hub's storage is another host: clients do not follow it on HEAD
    # id(bytes) -> (the bytes, their SHA-256): every listing and storage request looks files up by digest, which
    # would hash every file of the repository again for each download (the dataset benchmark serves 50 archives).
    # The bytes are held so that an id is never reused while its entry is here.
    digests: dict[int, tuple[bytes, str]] = {}

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def send_response(self, code: int, message: str | None = None) -> None:
        self.current.status = code
        super().send_response(code, message)

    def _allowed(self, repo_type: str, repo_id: str) -> bool:
        """A gated repository answers only its token, as the Hub does (401 without one, 403 with another)."""
        self.current.repo = (repo_type, repo_id)
        token = self.gated.get((repo_type, repo_id))
        if token is None:
            return True
        sent = self.headers.get("Authorization")
        if sent == f"Bearer {token}":
            return True
        kind = "dataset" if repo_type == "dataset" else "model"
        if sent is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to {kind} {repo_id} is restricted. You must have access to it and be authenticated to "
                f"access it. Please log in.",
            )
        else:
            self._error(
                403,
                "GatedRepo",
                f"Access to {kind} {repo_id} is restricted and you are not in the authorized list.",
            )
        return False

    def _sha256(self, data: bytes) -> str:
        known = self.digests.get(id(data))
        if known is None or known[0] is not data:
            known = self.digests[id(data)] = (data, hashlib.sha256(data).hexdigest())
        return known[1]

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
        origin = self.server.origin  # type: ignore[attr-defined]
        self.current = Request(origin, self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        self.log.append(self.current)
        self.requests.append(f"{self.command} {self.path}")
        url = urlparse(self.path)
        path = unquote(url.path)
        if origin == "storage":
            self._storage(path, parse_qs(url.query))
            return
        if match := TREE.match(path):
            kind, repo_id, revision, prefix = match.groups()
            if not self._allowed(kind[:-1], repo_id):
                return
            files = self._files(kind[:-1], repo_id, revision)
            if files is None:
                return
            entries = []
            for name, data in sorted(files.items()):
                if prefix and not name.startswith(prefix + "/"):
                    continue
                lfs = is_lfs(name, data)
                pointer = lfs_pointer(data, self._sha256(data)) if lfs else b""
                entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(pointer if lfs else data)}
                if lfs:
                    entry["lfs"] = {
                        "oid": self._sha256(data),
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
            prefix, repo_id, revision, name = match.groups()
            repo_type = prefix[:-2] if prefix else "model"
            if not self._allowed(repo_type, repo_id):
                return
            files = self._files(repo_type, repo_id, revision)
            if files is None:
                return
            if name not in files:
                self._error(404, "EntryNotFound", f"{name} not found at {revision}")
                return
            data = files[name]
            if is_lfs(name, data):
                sha = self._sha256(data)
                self.send_response(302)
                self.send_header("X-Repo-Commit", revision)
                self.send_header("ETag", f'"{git_blob_id(lfs_pointer(data, sha))}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                query = f"repo={quote(repo_id)}&file={quote(name)}&sig={signature(sha, repo_id)}"
                self.send_header("Location", f"{self.storage}/lfs-cdn/{sha}?{query}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send_bytes(data, {"X-Repo-Commit": revision, "ETag": f'"{git_blob_id(data)}"'})
            return
        self._error(404, "NotFound", f"no route for {path}")

    do_HEAD = do_GET

    def _storage(self, path: str, query: dict[str, list[str]]) -> None:
        """An object of the LFS storage, served only under the signature the Hub's redirect carried."""
        if not path.startswith("/lfs-cdn/"):
            self._error(404, "NotFound", f"no route for {path} on the storage")
            return
        sha = path.rsplit("/", 1)[1]
        repo_id = query.get("repo", [""])[0]
        if query.get("sig", [""])[0] != signature(sha, repo_id):
            self._error(403, "AccessDenied", "the signature of this URL does not match")
            return
        files = [fs for (_, rid), commits in self.repos.items() if rid == repo_id for fs in commits.values()]
        match = next(((n, d) for fs in files for n, d in fs.items() if self._sha256(d) == sha), None)
        if match is None:
            self._error(404, "EntryNotFound", f"no object {sha}")
            return
        name, data = match
        if name in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        if name in self.short:
            data = data[: len(data) // 2]
        self._send_bytes(data, {"ETag": f'"{sha}"'}, throttle=self.throttle)

    def _send_bytes(self, data: bytes, headers: dict[str, str], throttle: int = 0) -> None:
        start = 0
        if (rng := self.headers.get("Range")) and (m := re.match(r"bytes=(\d+)-$", rng)):
            start = int(m.group(1))
            self.requests.append(f"RANGE {start} {self.path}")
        if start and start >= len(data):  # nothing at or past the end: 416, as the Hub and its storage answer
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
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

    def __init__(
        self,
        repos: Repos,
        throttle: int = 0,
        corrupt: set[str] | None = None,
        short: set[str] | None = None,
        gated: dict[tuple[str, str], str] | None = None,
    ):
        attrs = {
            "repos": repos,
            "requests": [],
            "log": [],
            "throttle": throttle,
            "corrupt": corrupt or set(),
            "short": short or set(),
            "gated": gated or {},
            "digests": {},
        }
        handler = type("Handler", (HubHandler,), attrs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.storage_httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.origin, self.storage_httpd.origin = "hub", "storage"
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

    @property
    def log(self) -> list[Request]:
        return self.handler.log
