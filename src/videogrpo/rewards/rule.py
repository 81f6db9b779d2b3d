"""The rule reward: the pinned EvalKit's evaluators, called in a pool of scorer processes, submit now, collect later.

Per sample a worker scores the request as `scoring.score_one` says (the video prepared as the EvalKit
expects it, the evaluator called, the score contract checked). Tasks the EvalKit does not know score
`unsupported_score` with a warning. The workers are plain processes of the scorer's interpreter
(`scorer_process`: why not multiprocessing); this module is the driver's side, the pool.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

from videogrpo.errors import DiskFull, VideoGRPOError
from videogrpo.rewards.evalkit import check_digest
from videogrpo.rewards.request import ScoreRequest, request_to_message, score_request, warn_once
from videogrpo.rewards.scorer_process import ScorerDied, ScorerProcess, ScorerStartError, receive, send

__all__ = ["EvaluatorError", "RuleScorer", "ScoreRequest", "ScorerDied", "ScorerStartError", "score_request"]


@contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Scorer processes started with SIGINT ignored ignore it from their first instruction (an ignored signal
    stays ignored across exec, and Python keeps it so): a Ctrl-C while one is still importing must not print
    its traceback. The driver handles the Ctrl-C and closes the pool."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class EvaluatorError(VideoGRPOError):
    """Scoring a sample failed (an evaluator `error`, an exception, a missing file, a score outside the contract)
    while evalkit.fail_on_error is true."""


class RuleScorer:
    """A pool of scorer processes of the scorer's interpreter, each in the EvalKit checkout, CUDA hidden, its
    threads limited, its runtime checked again in itself; one thread of ours per process feeds it requests.

    `collect` applies evalkit.fail_on_error: a failed sample stops the run naming the task, the sample and
    the message, or keeps its score (0 for an evaluator `error`, evalkit.unsupported_score otherwise) with
    one warning per task, its `error` set (the trainer counts those as `reward_errors`). A process that dies
    fails its request and every later one with ScorerDied, naming the task and sample it was scoring, its exit
    status and its last log lines. A full disk is no sample's failure: it raises DiskFull whatever
    fail_on_error says.
    """

    def __init__(
        self,
        evalkit_path: str | Path,
        workers: int,
        threads_per_worker: int,
        fail_on_error: bool = True,
        easyocr_models: str = "easyocr_models",
        runtime: dict[str, str] | None = None,
        python: str = "",
        digest: str | None = None,
        policy: str = "",
    ):
        self.evalkit_path = str(Path(evalkit_path).resolve())
        self.python = python or sys.executable  # the scorer's own environment (evalkit.python), or this one
        self.fail_on_error = fail_on_error
        # Who chose fail_on_error when a caller overrides evalkit.fail_on_error: the warning names that caller
        # and its reason, never the config field the user set otherwise.
        self.policy = policy
        self.digest = digest
        self.warned: set[str] = set()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped: VideoGRPOError | None = None  # why submit() refuses: a dead process, or close()
        self._check_digest()
        self.processes: list[ScorerProcess] = []
        try:
            with _children_ignore_sigint():
                for _ in range(workers):
                    self.processes.append(
                        ScorerProcess(self.python, self.evalkit_path, threads_per_worker, easyocr_models)
                    )
            start = ("start", {"checkout": self.evalkit_path, "contract": runtime or {}})
            for process in self.processes:  # all start at once, then each answers
                try:
                    send(process.proc.stdin, start)
                except OSError:  # it is gone already: _started says why
                    pass
            replies = [self._started(process) for process in self.processes]
            self._check_digest()  # the code the processes imported is still the pinned one
        except BaseException:
            for process in self.processes:
                process.close(kill=True)
            raise
        self.tasks: list[str] = replies[0]["tasks"]
        """The checkout's TASK_EVALUATOR_MAP keys, as the scorer processes imported them."""
        self._threads = [threading.Thread(target=self._serve, args=(p,), daemon=True) for p in self.processes]
        for thread in self._threads:
            thread.start()

    def _check_digest(self) -> None:
        if self.digest is not None:
            check_digest(self.evalkit_path, self.digest)

    def _started(self, process: ScorerProcess) -> dict:
        try:
            reply = receive(process.proc.stdout)
        except OSError:
            reply = None
        if reply is None:
            raise ScorerStartError(
                f"a scorer process died while starting in {self.evalkit_path}: {process.death()}\n"
                f"Check evalkit.python, and that the scorer environment has videogrpo installed (`make scorer-env`)."
            )
        kind, payload = reply[0]
        if kind != "ready":
            raise ScorerStartError(
                f"a scorer worker could not start in the EvalKit checkout {self.evalkit_path} with {self.python}: "
                f"{payload}\nCheck evalkit.path, and that the scorer environment has the packages of evalkit.runtime."
            )
        return payload

    def _serve(self, process: ScorerProcess) -> None:
        while (job := self._jobs.get()) is not None:
            future, request = job
            if not future.set_running_or_notify_cancel():
                continue
            if self._stopped is not None:
                future.set_exception(self._stopped)
                continue
            try:
                message, frames = request_to_message(request)
                doing = f"scoring task {request.task}, sample {request.sample_dir}"
                kind, payload = process.ask(("score", message), [frames], doing)
            except ScorerDied as err:
                future.set_exception(err)
                self._stop(err)
                return
            except BaseException as err:  # noqa: BLE001 - that request's failure, for its collector
                future.set_exception(err)
                continue
            if kind == "result":
                future.set_result(payload)
            else:
                where = f"task {request.task} ({request.sample_dir})"
                future.set_exception(VideoGRPOError(f"the scorer process failed on {where}:\n{payload}"))

    def _stop(self, why: VideoGRPOError) -> None:
        """No more requests: the queued ones fail with `why` (a cancelled one stays cancelled)."""
        with self._lock:
            self._stopped = self._stopped or why
            sentinels = 0
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    sentinels += 1
                elif job[0].set_running_or_notify_cancel():
                    job[0].set_exception(self._stopped)
            for _ in range(sentinels):  # close()'s: the other threads still need them
                self._jobs.put(None)

    def submit(self, request: ScoreRequest) -> Future:
        future: Future = Future()
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._jobs.put((future, request))
        return future

    def collect(self, futures: list[Future]) -> list[dict]:
        results = [f.result() for f in futures]
        # Evaluators read annotations/ and their sources may be reloaded: scores made while the checkout
        # was edited are refused, not used (milliseconds per collect).
        self._check_digest()
        for r in results:
            if r.get("disk_full"):  # the stage's file system, not the sample: stop whatever fail_on_error says
                raise DiskFull(r["disk_full"])
        for r in results:
            if r.get("unsupported"):
                warn_once(
                    self.warned,
                    r["unsupported"],
                    f"task {r['unsupported']} is unknown to the EvalKit: scored evalkit.unsupported_score "
                    f"= {r['score']}",
                )
            elif r.get("error"):
                if r.get("ground_truth_missing"):  # checked before the EvalKit was called: no evaluator failed
                    failed = f"task {r['task']}: the sample {r['sample']} cannot be scored"
                else:
                    failed = f"the EvalKit evaluator of task {r['task']} failed on {r['sample']}"
                if self.fail_on_error:
                    raise EvaluatorError(
                        f"{failed}: {r['error']}\n"
                        f"evalkit.fail_on_error is true, so the run stops: fix the evaluator or the sample, or set "
                        f"evalkit.fail_on_error: false to score such rollouts {r['score']} (counted in "
                        f"reward_errors)."
                    )
                kept = self.policy or "counted in reward_errors (evalkit.fail_on_error is false)"
                warn_once(
                    self.warned,
                    r["task"],
                    f"{failed} ({r['error']}); scored {r['score']} and {kept}; further failures of this task are "
                    f"not repeated",
                )
        return results

    @classmethod
    def for_config(
        cls, cfg, evalkit_path: str | Path, fail_on_error: bool | None = None, policy: str = ""
    ) -> RuleScorer:
        """The scorer the `evalkit` config section describes (`fail_on_error` overrides evalkit.fail_on_error,
        `policy` says who overrides it and why, for the warning); the checkout must still have the source digest
        evalkit.digest."""
        from videogrpo.config import runtime_contract

        e = cfg.evalkit
        return cls(
            evalkit_path,
            e.workers,
            e.threads_per_worker,
            e.fail_on_error if fail_on_error is None else fail_on_error,
            e.easyocr_models,
            runtime_contract(cfg),
            e.python,
            digest=e.digest,
            policy=policy,
        )

    def close(self, kill: bool = False) -> None:
        """Queued requests are cancelled, running ones finish (`kill`: are abandoned), the processes exit."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        with self._lock:
            self._stopped = self._stopped or VideoGRPOError("the scorer pool is closed")
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in self._threads:
                self._jobs.put(None)
        if kill:
            for process in self.processes:
                process.proc.kill()
        for thread in self._threads:
            thread.join()
        for process in self.processes:
            process.close(kill=kill)

    def __enter__(self) -> RuleScorer:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(kill=exc_type is not None)  # an error or Ctrl-C: nobody waits for the scores in flight
