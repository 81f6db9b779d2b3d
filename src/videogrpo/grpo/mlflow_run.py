"""The MLflow run of a run identity: found by its tag or started once, and what the trainer and stages log there.

MLflow chooses its run ids itself, so the run identity (`<recipe>-<12 hex>`, the run directory's name) is the
run's name and its tag `videogrpo.run_identity`. Every writer (the trainer, a resumed trainer, matrix,
report) looks the run up by that tag, so a resume or a later stage continues that run instead of
opening a second one. The server comes from $MLFLOW_TRACKING_URI, credentials from MLflow's own variables
(MLFLOW_TRACKING_USERNAME/PASSWORD, MLFLOW_TRACKING_TOKEN): neither is ever a config field, a param or a
manifest entry. mlflow is imported only where a run is opened: a dry run never pays for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from videogrpo.errors import VideoGRPOError

URI_VAR = "MLFLOW_TRACKING_URI"
# What a job on another machine needs of the driver's environment to reach the server (a Kubernetes pod of the
# executor plugin gets only what the workflow names).
ENVIRONMENT = (URI_VAR, "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
IDENTITY_TAG = "videogrpo.run_identity"
# A param is written once (MLflow refuses a changed value): a resume that runs with another execution
# setting (the contract is the run identity, so only those can differ) records the new value as this tag.
RESUMED_TAG = "videogrpo.resumed_with."
# MLflow's own limits (mlflow.utils.validation, a test compares): 6000 characters a param value, 100
# params or tags and 1000 metrics a batch.
PARAM_VALUE_CHARS = 6000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, or an error naming the variable and the fix."""
    uri = os.environ.get(URI_VAR, "").strip()
    if not uri:
        raise VideoGRPOError(
            f"logging.tracker lists mlflow, but ${URI_VAR} is not set: `export {URI_VAR}=http://<host>:<port>` "
            f"(the tracking server; its credentials in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
            f"MLFLOW_TRACKING_TOKEN) before snakemake, or drop mlflow from logging.tracker"
        )
    return uri


def redacted(uri: str) -> str:
    """The URI without the user and password a URI may embed (`https://user:pass@host`), for logs."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as `section.field` -> text: nested dicts joined by dots, lists and nulls as JSON."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, name + "."))
        elif isinstance(value, str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, sort_keys=True)
    return flat


def param_value(text: str, limit: int = PARAM_VALUE_CHARS) -> str:
    """`text`, or its head and a note with its length and digest where MLflow's limit would refuse it (the whole
    config is the run's artifact config.json)."""
    if len(text) <= limit:
        return text
    note = f"... [{len(text)} chars, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}; whole in config.json]"
    return text[: limit - len(note)] + note


class Server:
    """The tracking server of $MLFLOW_TRACKING_URI and the experiment, through its REST API (MlflowClient: no
    global state, unlike mlflow.start_run)."""

    def __init__(self, experiment: str):
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri()
        # MLflow prints the run's address as the URI gives it, credentials included: our log line redacts them.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.client = MlflowClient(self.uri)
        self.experiment = experiment
        self.experiment_id = self._guarded("the experiment", lambda: self._experiment(experiment))

    def _guarded(self, what: str, call):
        try:
            return call()
        except VideoGRPOError:
            raise
        except Exception as err:  # MlflowException, or the connection's own error after MLflow's retries
            raise VideoGRPOError(
                f"MLflow at {redacted(self.uri)} (${URI_VAR}): cannot open {what} in experiment {self.experiment!r} "
                f"({type(err).__name__}: {str(err)[:500]}); start the server or correct ${URI_VAR} (credentials: "
                f"MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN), or drop mlflow from logging.tracker"
            ) from None

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                return self.client.create_experiment(name)
            except MlflowException:  # another writer created it in between
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage != "active":
            raise VideoGRPOError(
                f"logging.mlflow_experiment = {name!r}: the experiment is deleted on {redacted(self.uri)}; restore "
                f"it (`mlflow experiments restore --experiment-id {found.experiment_id}`) or name another"
            )
        return found.experiment_id


class Run(Server):
    """One run identity's MLflow run: found by its tag, or started."""

    def __init__(self, experiment: str, identity: str):
        super().__init__(experiment)
        self.identity = identity
        self.resumed = False
        self.run_id = self._guarded(f"the run of {identity}", self._run)

    def _tagged(self) -> list:
        from mlflow.entities import ViewType

        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{IDENTITY_TAG}` = '{self.identity}'",
            run_view_type=ViewType.ACTIVE_ONLY,
        )
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    def _run(self) -> str:
        found = self._tagged()
        self.resumed = bool(found)
        if found:
            return found[0].info.run_id
        made = self.client.create_run(self.experiment_id, run_name=self.identity, tags={IDENTITY_TAG: self.identity})
        # Two writers can both find none (matrix and report after a training that logged nowhere): each keeps
        # the oldest run and deletes its own newer one, so one run of the identity remains.
        oldest = self._tagged()[0].info.run_id
        if oldest != made.info.run_id:
            self.client.delete_run(made.info.run_id)
        return oldest

    def log_config(self, config: dict[str, Any]) -> None:
        """The config as params (first writer's values) and as the artifact config.json (the latest writer's)."""
        from mlflow.entities import Param, RunTag

        logged = self.client.get_run(self.run_id).data.params
        params, changed = [], []
        for key, text in flat_params(config).items():
            value = param_value(text)
            if key not in logged:
                params.append(Param(key, value))
            elif logged[key] != value:
                changed.append(RunTag(RESUMED_TAG + key, value))
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])
        for i in range(0, len(changed), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=changed[i : i + PARAMS_PER_BATCH])
        self.client.log_text(self.run_id, json.dumps(config, indent=2, sort_keys=True) + "\n", "config.json")

    def last_step(self, key: str = "step", default: int = 0) -> int:
        """The last update whose metrics the run holds (`default`: none): `step` is logged with every update,
        `val/reward_mean` with every validation point."""
        return max((m.step for m in self.client.get_metric_history(self.run_id, key)), default=default)

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in values.items()]
        for i in range(0, len(metrics), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + METRICS_PER_BATCH])

    def set_status(self, status: str) -> None:
        if status == "RUNNING":
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.client.set_terminated(self.run_id, status)

    def log_files(self, folder: str, files: list[Path]) -> None:
        for path in files:
            self.client.log_artifact(self.run_id, str(path), folder)


def log_stage_outputs(logging: Any, identity: str | None, stage: str, files: list[Path]) -> None:
    """A stage's tables or report as artifacts `<stage>/<file name>` of the identity's run, where the run logs to
    MLflow (`logging`: the stage's LoggingConfig); a rerun replaces them."""
    from videogrpo.config import uses_tracker

    if not uses_tracker(logging, "mlflow"):
        return
    if not identity:
        raise VideoGRPOError(f"{stage}: logging.tracker lists mlflow, but no --run-id names the run to log to")
    run = Run(logging.mlflow_experiment, identity)
    try:
        run.log_files(stage, files)
    except Exception as err:
        raise VideoGRPOError(
            f"{stage}: logging {', '.join(p.name for p in files)} to MLflow run {run.run_id} at "
            f"{redacted(run.uri)} failed ({type(err).__name__}: {str(err)[:500]}); rerun the stage once the "
            f"server answers (snakemake --forcerun {stage})"
        ) from None
    print(f"{stage}: {', '.join(p.name for p in files)} logged to MLflow run {run.run_id} ({identity})")
