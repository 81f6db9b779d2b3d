"""Write the hash locks of the GPU environment: envs/gpu.lock.txt (from envs/gpu.txt) and
envs/gpu-liger.lock.txt (the optional envs/gpu-liger.txt on top of it).

    python envs/lock_gpu.py          # rewrite both locks from the registry (about a minute)

pip resolves the top-level pins for Linux x86_64 (manylinux_2_28 and older tags) on Python 3.11 and
3.12 with `pip install --dry-run --report` (no wheel is installed), the shared packages constrained to
envs/cpu.lock.txt; every resolved wheel's sha256 goes into the lock, those of both Python versions
where the wheels differ. One lock serves both versions, so the two resolutions must pick the same
versions (this script refuses otherwise).

Without downloading wheels into the environment: pip reads a wheel's dependencies from the
`.metadata` file that PyPI serves beside it (PEP 658) when the index says the file exists, and pip
before 25 downloads every resolved wheel even then, so the resolver is pip RESOLVER_PIP, run from
its wheel. The registry mirror this project's machines reach leaves that advertisement out (pip would
download about 3 GB of CUDA wheels per resolution), and it has no `.metadata` file for many wheels:
`metadata_index` is a loopback index that relays the registry's PEP 691 JSON pages, advertises every
wheel's metadata and serves it, the registry's file or, where there is none, read from the wheel
(fetched by the relay, once; all kept in METADATA_CACHE). torch and the NVIDIA libraries have theirs.

A package published only as an sdist (connection_pool, for snakemake) has no wheel for
`--only-binary=:all:`, which pip requires with `--platform`: it is pinned by its sdist's hash (pip
builds it at install; it is pure Python) and for the resolution it is built here into a local wheel,
from that hash, and offered with `--find-links`.

tests/test_gpu_env.py resolves again with these functions and checks the locks against the result.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from videogrpo.atomic import write_bytes, write_text

ENVS = Path(__file__).resolve().parent
GPU_TXT = ENVS / "gpu.txt"
GPU_LOCK = ENVS / "gpu.lock.txt"
LIGER_TXT = ENVS / "gpu-liger.txt"
LIGER_LOCK = ENVS / "gpu-liger.lock.txt"
CPU_TXT = ENVS / "cpu.txt"
CPU_LOCK = ENVS / "cpu.lock.txt"
PYTHONS = ("3.11", "3.12")
REGISTRY = "https://pypi.org/simple/"
# pip matches --platform literally (it does not widen manylinux_2_28 to the older tags that glibc 2.28
# also runs), so every tag a glibc >= 2.28 x86_64 machine accepts is listed.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
METADATA_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "videogrpo" / "wheel-metadata"
_fetching: dict[str, threading.Lock] = {}  # one fetch per wheel while both resolutions ask for it
SDIST_MARK = "# sdist-only:"
# Found by resolving without --platform (sdists allowed): the only URL not a wheel. A new one shows as
# "No matching distribution found for NAME" or as a conflict naming it: add it here.
SDIST_ONLY = ("connection_pool",)
# The resolver: pip before 25 downloads every resolved wheel even in --dry-run; this one reads only
# their .metadata. Run from its wheel (a wheel is importable), fetched by this hash.
RESOLVER_PIP = ("26.3", "f3b60b20ffaadd4415ed7957212a38ac63fa4c5fa375bd0f4a797777940fad13")
_JSON = "application/vnd.pypi.simple.v1+json"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements or lock file."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if match:
            pins[canonical(match[1])] = match[2]
    return pins


def read_lock(path: Path) -> tuple[dict[str, tuple[str, set[str]]], set[str]]:
    """(name -> (version, sha256 hashes)), and the names the lock marks as sdist-only."""
    text = path.read_text().replace("\\\n", " ")
    entries: dict[str, tuple[str, set[str]]] = {}
    sdist_only: set[str] = set()
    for line in text.splitlines():
        if line.startswith(SDIST_MARK):
            sdist_only |= {canonical(n) for n in line[len(SDIST_MARK) :].split()}
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+(.*)$", line)
        if match:
            hashes = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", match[3]))
            entries[canonical(match[1])] = (match[2], hashes)
    return entries, sdist_only


class _Relay(http.server.BaseHTTPRequestHandler):
    upstream = REGISTRY

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        if self.path.startswith("/files/"):
            self._metadata("https://" + urllib.parse.unquote(self.path.removeprefix("/files/")))
            return
        request = urllib.request.Request(self.upstream + self.path.removeprefix("/simple/"), headers={"Accept": _JSON})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                page = json.load(response)
        except urllib.error.HTTPError as error:
            self.send_error(error.code)
            return
        base = f"http://{self.headers['Host']}/files/"
        for entry in page.get("files", []):
            if entry["filename"].endswith(".whl"):
                # pip then asks this relay for `<url>.metadata` (PEP 714's key, and PEP 658's for older pip).
                entry["url"] = base + entry["url"].removeprefix("https://")
                entry["core-metadata"] = entry["dist-info-metadata"] = True
        self._send(json.dumps(page).encode(), _JSON)

    def _metadata(self, url: str) -> None:
        if not url.endswith(".whl.metadata"):
            self.send_error(404)
            return
        try:
            body = wheel_metadata(url.removesuffix(".metadata"))
        except urllib.error.HTTPError as error:
            self.send_error(error.code)
            return
        self._send(body, "binary/octet-stream")

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def wheel_metadata(wheel_url: str) -> bytes:
    """A wheel's METADATA: the registry's `.metadata` file, or, where it serves none, read from the wheel.

    Kept in METADATA_CACHE by URL: a registry file never changes under its URL (the path holds its
    hash), so the two resolutions share each file and a second run fetches none.
    """
    cached = METADATA_CACHE / hashlib.sha256(wheel_url.encode()).hexdigest()
    with _fetching.setdefault(wheel_url, threading.Lock()):
        if cached.is_file():
            return cached.read_bytes()
        try:
            with urllib.request.urlopen(wheel_url + ".metadata", timeout=120) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
            # The registry mirror serves no .metadata for many wheels (pyarrow, av, wandb...): fetched whole, here only.
            print(f"no .metadata on the registry, reading the wheel: {wheel_url.rsplit('/', 1)[-1]}", file=sys.stderr)
            with urllib.request.urlopen(wheel_url, timeout=600) as response:
                wheel = zipfile.ZipFile(io.BytesIO(response.read()))
            (name,) = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            body = wheel.read(name)
        write_bytes(cached, body)
        return body


@contextlib.contextmanager
def metadata_index(upstream: str = REGISTRY) -> Iterator[str]:
    """The URL of a loopback index relaying `upstream`'s JSON pages with every wheel's metadata advertised."""
    handler = type("Relay", (_Relay,), {"upstream": upstream})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def _pip(*args: str, timeout: float = 600, pip: Path | None = None) -> subprocess.CompletedProcess[str]:
    runner = [str(pip)] if pip else ["-m", "pip"]
    command = [sys.executable, *runner, "--isolated", "--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def resolver_pip(work: Path) -> Path:
    """RESOLVER_PIP's wheel, fetched with its hash into `work`; `python WHEEL/pip` runs it."""
    version, digest = RESOLVER_PIP
    requirement = work / "resolver-pip.txt"
    requirement.write_text(f"pip=={version} --hash=sha256:{digest}\n")
    result = _pip(
        "download", "--no-deps", "--require-hashes", "--index-url", REGISTRY, "-d", str(work), "-r", str(requirement)
    )
    if result.returncode != 0:
        raise RuntimeError(f"fetching pip {version} from {REGISTRY} failed:\n{result.stderr.strip()}")
    return work / f"pip-{version}-py3-none-any.whl" / "pip"


def cpu_constraints(directory: Path) -> Path:
    """envs/cpu.lock.txt less its torch pin (the CPU build's local version, `+cpu`) as a constraints file."""
    path = directory / "cpu-constraints.txt"
    lines = [line for line in CPU_LOCK.read_text().splitlines() if canonical(line.split("==")[0]) != "torch"]
    write_text(path, "\n".join(lines) + "\n")
    return path


def resolve(python: str, requirements: list[Path], index: str, find_links: Path, work: Path, pip: Path) -> dict:
    """pip's report of resolving `requirements` for Linux x86_64 on `python`; nothing is installed."""
    target = Path(tempfile.mkdtemp(dir=work))
    report = target / "report.json"
    args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--target", str(target / "site")]
    args += ["--report", str(report), "--index-url", index, "--find-links", str(find_links)]
    args += ["--only-binary=:all:", "--python-version", python, *(f"--platform={p}" for p in PLATFORMS)]
    args += ["-c", str(cpu_constraints(target))]
    for path in requirements:
        args += ["-r", str(path)]
    result = _pip(*args, pip=pip)
    if result.returncode != 0:
        raise ResolutionError(python, result.stderr)
    return json.loads(report.read_text())


class ResolutionError(RuntimeError):
    def __init__(self, python: str, stderr: str):
        self.missing = re.findall(r"No matching distribution found for ([A-Za-z0-9._-]+)", stderr)
        super().__init__(f"pip could not resolve for Python {python}:\n{stderr.strip()}")


def marker_drift(report: dict, python: str) -> list[str]:
    """Dependencies whose environment marker reads differently on `python` than on the interpreter pip ran on.

    pip applies --python-version to wheel tags and Requires-Python but evaluates markers for the running
    interpreter, so a resolution on 3.11 for 3.12 is only right where no marker of a requested
    dependency (with the extras asked of its package) tells the two apart.
    """
    from packaging.requirements import Requirement

    here = dict(report["environment"])
    there = dict(here, python_version=python, python_full_version=f"{python}.0")
    items = report["install"]
    extras: dict[str, set[str]] = {
        canonical(i["metadata"]["name"]): set(i.get("requested_extras") or ()) for i in items
    }
    parsed = [
        (i["metadata"]["name"], Requirement(spec)) for i in items for spec in i["metadata"].get("requires_dist", [])
    ]
    for _, requirement in parsed:
        if canonical(requirement.name) in extras:
            extras[canonical(requirement.name)] |= requirement.extras
    drift = []
    for name, requirement in parsed:
        if requirement.marker is None:
            continue
        for extra in ["", *extras[canonical(name)]]:
            if requirement.marker.evaluate(dict(here, extra=extra)) != requirement.marker.evaluate(
                dict(there, extra=extra)
            ):
                drift.append(f"{name}: {requirement}")
                break
    return drift


def resolved(report: dict) -> dict[str, tuple[str, str, str]]:
    """name -> (version, sha256, URL) of each resolved wheel."""
    out = {}
    for item in report["install"]:
        info = item["download_info"]
        digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        url = re.sub(r"^http://127\.0\.0\.1:\d+/files/", "https://", info["url"])  # the relay's, back to the registry's
        out[canonical(item["metadata"]["name"])] = (item["metadata"]["version"], digest, url)
    return out


def build_sdist_wheels(pins: dict[str, tuple[str, set[str]]], wheels: Path) -> None:
    """Build the sdist-only pins into `wheels`, each from the sdist whose hash the lock gives."""
    if not pins:
        return
    requirements = wheels / "sdist-only.txt"
    lines = [
        f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hs))
        for name, (version, hs) in pins.items()
    ]
    requirements.write_text("\n".join(lines) + "\n")
    args = ["wheel", "--no-deps", "--require-hashes", "--index-url", REGISTRY]
    result = _pip(*args, "-w", str(wheels), "-r", str(requirements))
    if result.returncode != 0:
        raise RuntimeError(f"building the sdist-only pins failed:\n{result.stderr.strip()}")


def resolve_all(requirements: list[Path], sdist_pins: dict[str, tuple[str, set[str]]], work: Path) -> dict[str, dict]:
    """python version -> pip's report, for each of PYTHONS, the two resolutions running side by side."""
    wheels = work / "wheels"
    wheels.mkdir(exist_ok=True)
    build_sdist_wheels(sdist_pins, wheels)
    pip = resolver_pip(work)
    with metadata_index() as index, ThreadPoolExecutor(len(PYTHONS)) as pool:
        futures = {py: pool.submit(resolve, py, requirements, index, wheels, work, pip) for py in PYTHONS}
        return {py: future.result() for py, future in futures.items()}


def _sdist_pin(name: str, work: Path) -> tuple[str, tuple[str, set[str]]]:
    """The sdist hash of a package that has no wheel, at envs/cpu.lock.txt's version."""
    version = read_pins(CPU_LOCK).get(canonical(name))
    if version is None:
        raise SystemExit(f"{name} has no wheel for Linux x86_64 and no pin in {CPU_LOCK}: pin it there")
    directory = Path(tempfile.mkdtemp(dir=work))
    args = ["download", "--no-deps", f"--no-binary={name}", "--index-url", REGISTRY, "-d", str(directory)]
    result = _pip(*args, f"{name}=={version}")
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    (sdist,) = directory.iterdir()
    return canonical(name), (version, {hashlib.sha256(sdist.read_bytes()).hexdigest()})


def _merge(reports: dict[str, dict], wheels_dir_prefix: str = "file:") -> dict[str, tuple[str, set[str]]]:
    merged: dict[str, tuple[str, set[str]]] = {}
    for python, report in reports.items():
        drift = marker_drift(report, python)
        if drift:
            raise SystemExit(
                f"markers read differently on Python {python}; run this script with it:\n" + "\n".join(drift)
            )
        for name, (version, digest, url) in resolved(report).items():
            if url.startswith(wheels_dir_prefix):
                continue  # a wheel built here from an sdist-only pin: its sdist hash is the pin
            old_version, hashes = merged.get(name, (version, set()))
            if old_version != version:
                raise SystemExit(
                    f"{name}: {old_version} on one Python version, {version} on {python}: pin it in gpu.txt"
                )
            merged[name] = (version, hashes | {digest})
    return merged


def _write(path: Path, header: str, pins: dict[str, tuple[str, set[str]]], sdist_only: set[str]) -> None:
    lines = [header.rstrip()]
    if sdist_only:
        lines += ["# No wheel on PyPI for these; pip builds each from the sdist of its hash:"]
        lines += [f"{SDIST_MARK} {' '.join(sorted(sdist_only))}"]
    for name in sorted(pins):
        version, hashes = pins[name]
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{h} \\" for h in sorted(hashes)]
        lines[-1] = lines[-1].removesuffix(" \\")
    write_text(path, "\n".join(lines) + "\n")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sdist_pins = dict(_sdist_pin(name, work) for name in SDIST_ONLY)
        base = resolve_all([GPU_TXT], sdist_pins, work)
        both = resolve_all([GPU_TXT, LIGER_TXT], sdist_pins, work)
        pins = _merge(base)
        with_liger = _merge(both)
        extra = set(with_liger) - set(pins)
        changed = [name for name in pins if with_liger.get(name, (None,))[0] != pins[name][0]]
        if changed or extra != set(read_pins(LIGER_TXT)):
            raise SystemExit(f"envs/gpu-liger.txt changes the base environment: added {extra}, changed {changed}")
        header = f"# Generated by `python envs/lock_gpu.py` from {{}}: Linux x86_64, Python {' and '.join(PYTHONS)}."
        _write(
            GPU_LOCK,
            header.format("envs/gpu.txt") + "\n# Install: make gpu-env",
            {**pins, **sdist_pins},
            set(sdist_pins),
        )
        liger_header = header.format("envs/gpu-liger.txt") + "\n# On top of envs/gpu.lock.txt: make gpu-env GPU_LIGER=1"
        _write(LIGER_LOCK, liger_header, {name: with_liger[name] for name in extra}, set())
        print(f"wrote {GPU_LOCK} ({len(pins) + len(sdist_pins)} packages) and {LIGER_LOCK} ({len(extra)})")


if __name__ == "__main__":
    main()
