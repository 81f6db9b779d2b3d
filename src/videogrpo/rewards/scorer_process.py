"""One scorer process: launched as `evalkit.python -m videogrpo.rewards.scorer_process` in the EvalKit checkout.

Why not multiprocessing: its spawn start hands the parent's `sys.path` (and main module) to the child
before anything loads, so a child of another interpreter imports the driver's packages (measured: the
driver's numpy and no cv2) while a plain subprocess probe of that interpreter sees its own. A plain
subprocess sees only its interpreter's own `sys.path` (plus the process environment), and every use goes
through `ScorerProcess`: the pool's workers, the runtime probe of `check_scorer_runtime`, and preflight's
task listing start the same way, so none can pass while another would fail.

Protocol (stdin -> requests, a private copy of stdout -> replies; fd 1 itself is pointed at stderr, so
an evaluator's prints reach the log and never the protocol): each message is an 8-byte big-endian header
length, a pickled `(message, blob_sizes)` of plain Python values, then the raw blobs (the frames, sent
without a copy). Messages, parent -> worker:
  ("probe", contract)                   -> ("probe", the runtime probe's findings)
  ("start", {"checkout", "contract"})   -> ("ready", {"tasks": [...]}) or ("start_error", why)
  ("score", request fields) + frames    -> ("result", result dict)
Any other failure of the worker's own code answers ("failed", traceback). End of stdin: the worker exits.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from videogrpo.errors import VideoGRPOError
from videogrpo.provenance import digest
from videogrpo.rewards.evalkit import run_probe, runtime_problems

MODULE = "videogrpo.rewards.scorer_process"
PROTOCOL = 5
_HEADER = struct.Struct(">Q")


class ScorerStartError(VideoGRPOError):
    """A scorer process could not import or check the EvalKit: the cause, not a bare broken pipe."""


class ScorerDied(VideoGRPOError):
    """A scorer process ended while the pool needed it (killed, out of memory, an evaluator exiting)."""


def send(stream, message, blobs=()) -> None:
    views = [memoryview(blob).cast("B") for blob in blobs]
    header = pickle.dumps((message, [v.nbytes for v in views]), protocol=PROTOCOL)
    stream.write(_HEADER.pack(len(header)))
    stream.write(header)
    for view in views:
        stream.write(view)
    stream.flush()


def _read_exact(stream, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view, done = memoryview(buffer), 0
    while done < size:
        got = stream.readinto(view[done:])
        if not got:
            return None
        done += got
    return buffer


def receive(stream) -> tuple[object, list[bytearray]] | None:
    """The next message and its blobs, or None at the end of the stream."""
    head = _read_exact(stream, _HEADER.size)
    if head is None:
        return None
    header = _read_exact(stream, _HEADER.unpack(head)[0])
    if header is None:
        return None
    message, sizes = pickle.loads(header)
    blobs = []
    for size in sizes:
        blob = _read_exact(stream, size)
        if blob is None:
            return None
        blobs.append(blob)
    return message, blobs


def scorer_environment(checkout: str, threads: int, easyocr_models: str) -> dict[str, str]:
    """The environment of every scorer process (docs/reference-system.md#rule-reward), set before its interpreter
    starts, so
    that numpy and torch read the thread limits at their first import."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["CUDA_VISIBLE_DEVICES"] = ""  # EasyOCR opens GPU readers whenever CUDA is visible
    env["EASYOCR_MODULE_PATH"] = os.path.join(checkout, easyocr_models)
    return env


class ScorerProcess:
    """The parent's handle of one scorer process: one exchange at a time (`ask`), its stderr forwarded to
    ours with the last lines kept for the error that reports its death."""

    def __init__(self, python: str, checkout: str, threads: int = 1, easyocr_models: str = "easyocr_models"):
        self.python = python
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        try:
            # Started with SIGINT ignored (the caller's _children_ignore_sigint): a Ctrl-C is the driver's to
            # handle, and an ignored signal stays ignored from the child's first instruction.
            self.proc = subprocess.Popen(
                [python, "-m", MODULE],
                cwd=checkout,  # compatibility revisions read ./easyocr_models and annotations/ from here
                env=scorer_environment(checkout, threads, easyocr_models),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as err:
            raise ScorerStartError(
                f"evalkit.python = {python!r} cannot be run ({err}); point it at the scorer environment's "
                f"interpreter (`make scorer-env`: .venv-scorer/bin/python), or leave it empty for this one"
            ) from None
        self._forwarder = threading.Thread(target=self._forward_stderr, daemon=True)
        self._forwarder.start()

    def _forward_stderr(self) -> None:
        for line in iter(self.proc.stderr.readline, b""):
            text = line.decode(errors="replace")
            self.tail.append(text.rstrip("\n"))
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone (shutting down): keep draining the pipe
                pass

    def ask(self, message, blobs=(), doing: str = ""):
        """Send one message and wait for its reply; ScorerDied when the process ends instead, naming what it was
        `doing` (the task and sample it was scoring)."""
        try:
            send(self.proc.stdin, message, blobs)
            reply = receive(self.proc.stdout)
        except (BrokenPipeError, ConnectionResetError, ValueError, OSError):  # ValueError: a closed pipe
            reply = None
        if reply is None:
            raise ScorerDied(self.death(doing))
        return reply[0]

    def death(self, doing: str = "") -> str:
        """Why the process is gone: its exit status, what it was `doing`, and its last lines on stderr."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._forwarder.join(timeout=5)
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        last = "\n    ".join(list(self.tail)[-12:]) or "(nothing on stderr)"
        during = f" while {doing}" if doing else ""
        return (
            f"the scorer process ({self.python}, pid {self.proc.pid}) ended ({how}){during}; its last lines:\n"
            f"    {last}"
        )

    def close(self, kill: bool = False) -> None:
        if kill and self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.stdin.close()  # end of requests: the worker exits
        except OSError:
            pass
        try:
            self.proc.wait(timeout=None if kill else 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._forwarder.join(timeout=5)
        self.proc.stdout.close()
        if not self._forwarder.is_alive():  # else a process it started still holds the pipe: leave it to it
            self.proc.stderr.close()


def probe_in_scorer(contract: dict[str, str], python: str, checkout: str | None = None) -> dict:
    """The runtime probe run in a scorer process started exactly as the pool's workers start."""
    process = ScorerProcess(python, str(Path(checkout or os.getcwd()).resolve()))
    try:
        kind, found = process.ask(("probe", contract))
    finally:
        process.close()
    if kind != "probe":
        raise VideoGRPOError(f"scorer runtime probe with {python} failed:\n{found}")
    return found


def check_runtime(contract: dict[str, str], python: str | None = None, checkout: str | Path | None = None) -> dict:
    """The scorer interpreter's packages against the contract, and its imports of the EvalKit's module-level
    modules, probed in a scorer process started exactly as the scorer workers start (in `checkout`, default here);
    the fingerprint covers the contract and everything found."""
    python = python or sys.executable
    probe = probe_in_scorer(contract, python, str(checkout) if checkout else None)
    problems = runtime_problems(contract, probe)
    canonical = json.dumps(
        {"contract": contract, "found": probe["found"], "checks": probe["checks"]},
        sort_keys=True,
        separators=(",", ":"),
    )
    record = {
        "python": python,
        "python_version": probe["python"],
        "contract": contract,
        "found": probe["found"],
        "imports": probe["imports"],
        "evalkit_imports": probe["evalkit_imports"],
        "checks": probe["checks"],
        "fingerprint": digest.sha256_bytes(canonical.encode()),
    }
    if problems:
        raise VideoGRPOError(
            "scorer runtime breaks evalkit.runtime:\n  "
            + "\n  ".join(problems)
            + f"\nInstall the pinned versions into the scorer environment ({python}) or fix the contract."
        )
    return record


# ---- the worker side --------------------------------------------------------------------------------


def _start(checkout: str, contract: dict[str, str]):
    problems = runtime_problems(contract, run_probe(contract))
    if problems:
        raise VideoGRPOError("the scorer runtime breaks evalkit.runtime: " + "; ".join(problems))
    sys.path.insert(0, checkout)  # as the reference: the checkout's run_evaluation and vbvr_bench importable
    import run_evaluation
    from vbvr_bench.evaluators import TASK_EVALUATOR_MAP

    return run_evaluation, TASK_EVALUATOR_MAP


def _answer(message, blobs, state: dict):
    kind, payload = message
    if kind == "probe":
        return "probe", run_probe(payload)
    if kind == "start":
        try:
            state["evalkit"] = _start(payload["checkout"], payload["contract"])
        except BaseException as err:  # noqa: BLE001 - any failure here must reach the parent with its cause
            return "start_error", "".join(traceback.format_exception_only(type(err), err)).strip()
        return "ready", {"tasks": sorted(state["evalkit"][1])}
    if kind == "score":
        from videogrpo.rewards.request import request_from_message  # numpy, only where a score is asked
        from videogrpo.rewards.scoring import score_one

        return "result", score_one(request_from_message(payload, blobs[0]), state["evalkit"])
    raise ValueError(f"unknown scorer message {kind!r}")


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it closes the pool
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # what the EvalKit prints goes to the log, never into the protocol
    state: dict = {}
    while (message := receive(requests)) is not None:
        try:
            reply = _answer(*message, state)
        except Exception:  # noqa: BLE001 - reported to the parent, which fails that request
            reply = ("failed", traceback.format_exc())
        try:
            send(replies, reply)
        except BrokenPipeError:  # the parent is gone
            return


if __name__ == "__main__":
    main()
