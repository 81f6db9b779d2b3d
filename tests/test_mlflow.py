"""MLflow as a tracker, against a real tracking server this module starts (`mlflow server`, SQLite, loopback),
read back through MlflowClient: params and per-update metrics of a training SIGKILLed and resumed (one
MLflow run and one W&B run id across both attempts), the stages' artifacts in that run, the URI's checks,
and credentials that never reach a manifest."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from demo import run as run_in

from videogrpo import cli, config
from videogrpo.errors import VideoGRPOError
from videogrpo.grpo import mlflow_run
from videogrpo.preflight import checks as preflight
from videogrpo.provenance.manifest import assert_no_secrets

from harness import metrics, solo_config, train, validation_point

BIN = Path(sys.executable).parent
PASSWORD = "MlflowMarkerPassword0123456789"
IDENTITY = "test"  # the run identity tests/harness.py gives the trainer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a free loopback port; the module's tests run with $MLFLOW_TRACKING_URI naming it, with
    credentials in the URI (the server has no auth and ignores them): they must never reach a manifest."""
    where = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{where}/mlflow.db"]
    args += ["--artifacts-destination", str(where / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--workers", "1"]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    t0 = time.monotonic()
    proc = subprocess.Popen(args, cwd=where, env=env, stdout=open(where / "log.txt", "w"), stderr=subprocess.STDOUT)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.read() == b"OK":
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > 120:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {(where / 'log.txt').read_text()[-3000:]}")
        time.sleep(0.1)
    print(f"mlflow server answered /health after {time.monotonic() - t0:.1f} s")
    before = os.environ.get(mlflow_run.URI_VAR)
    os.environ[mlflow_run.URI_VAR] = f"http://videogrpo:{PASSWORD}@127.0.0.1:{port}"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.environ.pop(mlflow_run.URI_VAR) if before is None else os.environ.update({mlflow_run.URI_VAR: before})
        proc.terminate()
        proc.wait(timeout=30)


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def tagged_runs(uri: str, experiment: str, c=None) -> list:
    c = c or client(uri)
    found = c.get_experiment_by_name(experiment)
    return c.search_runs([found.experiment_id], f"tags.`{mlflow_run.IDENTITY_TAG}` = '{IDENTITY}'") if found else []


TRAIN = dict(train={"max_steps": 5, "save_steps": 2})
LOGGING = {"tracker": ["wandb", "mlflow"], "wandb_mode": "offline", "mlflow_experiment": "resumed"}


@pytest.fixture(scope="module")
def resumed(server, tiny_model, dataset, tmp_path_factory):
    """A training SIGKILLed once its MLflow run holds update 3 (its last checkpoint: update 2), then rerun: it
    resumes, redoes update 3 and finishes. Returns the config and the run directory."""
    cfg = solo_config(**TRAIN, logging=LOGGING)
    out = tmp_path_factory.mktemp("resumed")
    lines = out / "checkpoints/metrics.jsonl"

    def update_3_logged(_):  # the trainer writes a line once the trackers have the update
        return lines.exists() and len(lines.read_text().splitlines()) >= 3

    assert not train(cfg, out, tiny_model, dataset, kill_when=update_3_logged)
    assert not (out / "final").exists()
    (found,) = tagged_runs(server, "resumed")
    held = max(m.step for m in client(server).get_metric_history(found.info.run_id, "step"))
    assert held in (3, 4)  # 4 if update 4 was logged within the trigger's 50 ms
    assert train(cfg, out, tiny_model, dataset)
    log = (out / "log.txt").read_text()
    assert "resumed from" in log and "step-00000002 (update 2 of 5)" in log, log[-3000:]
    assert f"resumed after update {held}" in log, log[-3000:]  # the redone updates up to it: not logged again
    assert PASSWORD not in log and "at http://***@127.0.0.1:" in log
    return cfg, out


def test_a_resumed_training_continues_its_one_mlflow_run_with_each_update_logged_once(server, resumed):
    cfg, out = resumed
    (found,) = tagged_runs(server, "resumed")  # one run of the identity across both attempts
    run = client(server).get_run(found.info.run_id)
    assert run.info.run_name == IDENTITY and run.info.status == "FINISHED"
    lines = metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5]
    flat_names = [k for k, v in lines[0].items() if isinstance(v, (int, float))]
    tasks = sorted({t for m in lines for t in m["reward_per_task"]})
    assert "reward_mean" in flat_names and "time_step_s" in flat_names and tasks
    assert set(run.data.metrics) == set(flat_names) | {f"reward/{t}" for t in tasks}
    for name in flat_names:
        history = client(server).get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == [1, 2, 3, 4, 5], name  # update 3, redone, logged once
        if name.startswith("time_"):  # measured: update 3 keeps what the first attempt measured
            continue
        # The redone update 3 gave what the first attempt logged (a resume is bit-identical).
        assert {m.step: m.value for m in history} == {m["step"]: float(m[name]) for m in lines}, name
    for task in tasks:
        history = client(server).get_metric_history(run.info.run_id, f"reward/{task}")
        assert {m.step: m.value for m in history} == {
            m["step"]: m["reward_per_task"][task] for m in lines if task in m["reward_per_task"]
        }


def test_the_resolved_config_is_the_runs_params_and_its_config_artifact(server, resumed):
    cfg, _ = resumed
    (found,) = tagged_runs(server, "resumed")
    resolved = config.to_dict(config.from_dict(cfg))
    params = client(server).get_run(found.info.run_id).data.params
    assert params == mlflow_run.flat_params(resolved)
    assert params["train.lr"] == "0.0001" and params["logging.tracker"] == '["wandb", "mlflow"]'
    assert params["grpo.sampler"] == cfg["grpo"]["sampler"]
    artifact = client(server).download_artifacts(found.info.run_id, "config.json")
    assert json.loads(Path(artifact).read_text()) == resolved


def test_a_killed_and_resumed_training_has_one_wandb_run_id(resumed):
    """W&B offline: each attempt writes its own folder, both of the one run id (the run identity); `wandb sync`
    uploads them as one run."""
    _, out = resumed
    folders = sorted((out / "wandb").glob("offline-run-*"))
    assert len(folders) == 2, folders
    assert {f.name.rsplit("-", 1)[1] for f in folders} == {IDENTITY}
    assert all((f / f"run-{IDENTITY}.wandb").stat().st_size > 0 for f in folders)


def test_matrix_and_report_log_their_outputs_to_the_same_run(server, resumed, tmp_path):
    """The two stage commands, in this process on small inputs (the cells' scores as the matrix's stages would
    leave them: this test is about where the tables go), each logging to the run the training opened, found by
    its tag. The held-out check's tables are the matrix's."""
    _, out = resumed
    logging = {"logging": LOGGING}
    frame = pd.DataFrame(
        {
            "name": [f"d/t{i}/0000{i}" for i in range(4)],
            "domain": ["In-Domain_50"] * 3 + ["Out-of-Domain_50"],
            "task": ["a", "a", "b", "c"],
            "score": [0.2, 0.4, 0.6, 1.0],
        }
    )
    for cell in ("base", "trained"):
        frame.assign(score=frame.score + (cell == "trained") * 0.1).to_csv(tmp_path / f"{cell}.csv", index=False)
    mx = tmp_path / "matrix"
    matrix_config = json.dumps({"matrix": {"bootstrap": 50, "seed": 0}, **logging})
    argv = ["stage", "matrix", "--config-json", matrix_config, "--table", str(mx / "matrix.csv")]
    argv += ["--cell", f"base:euler={tmp_path / 'base.csv'}", "--cell", f"trained:euler={tmp_path / 'trained.csv'}"]
    argv += ["--per-task", str(mx / "per_task.csv"), "--run-id", IDENTITY]
    argv += ["--manifest", str(mx / "matrix.manifest.json")]
    assert cli.main(argv) == 0

    rp = tmp_path / "report"
    argv = ["stage", "report", "--config-json", json.dumps({"recipe": "tiny", **logging}), "--run-id", IDENTITY]
    argv += ["--metrics", str(out / "metrics.jsonl")]  # no stage manifests: the trainer here wrote none
    argv += ["--per-task", str(mx / "per_task.csv"), "--matrix", str(mx / "matrix.csv")]
    argv += ["--provenance", str(rp / "provenance.json"), "--html", str(rp / "report.html")]
    argv += ["--crate", str(rp / "ro-crate-metadata.json"), "--manifest", str(rp / "report.manifest.json")]
    rp.mkdir()
    assert cli.main(argv) == 0

    (found,) = tagged_runs(server, "resumed")  # still the one run: the stages found it by its tag
    run_id = found.info.run_id
    logged = {
        f"{stage}/{name}": local
        for stage, folder, names in (
            ("matrix", mx, ["matrix.csv", "per_task.csv"]),
            ("report", rp, ["report.html", "provenance.json"]),
        )
        for name in names
        for local in [folder / name]
    }
    for stage in ("matrix", "report"):
        listed = {f.path for f in client(server).list_artifacts(run_id, stage)}
        assert listed == {path for path in logged if path.startswith(stage + "/")}
    for path, local in logged.items():
        assert Path(client(server).download_artifacts(run_id, path)).read_bytes() == local.read_bytes(), path
    # The URI carried a password: no manifest or output holds it, and the guard refuses text that does.
    for written in tmp_path.rglob("*"):
        if written.is_file():
            assert PASSWORD not in written.read_text(errors="ignore"), written
    assert PASSWORD not in "".join(p.read_text() for p in out.glob("*.json"))
    with pytest.raises(VideoGRPOError, match="MLFLOW_TRACKING_URI"):
        assert_no_secrets(f"password {PASSWORD}", "m.json")


def test_a_param_longer_than_mlflows_limit_is_cut_with_its_length_and_digest(server):
    from mlflow.utils import validation

    assert mlflow_run.PARAM_VALUE_CHARS == validation.MAX_PARAM_VAL_LENGTH
    assert mlflow_run.PARAMS_PER_BATCH == validation.MAX_PARAMS_TAGS_PER_BATCH
    assert mlflow_run.METRICS_PER_BATCH == validation.MAX_METRICS_PER_BATCH
    long = "x" * 7000
    made = {"reward": {"judge_serve_command": long}, **{f"s{i}": {"f": i} for i in range(150)}}
    run = mlflow_run.Run("long-params", IDENTITY)
    run.log_config(made)
    params = client(server).get_run(run.run_id).data.params
    assert len(params) == 151 and params["s149.f"] == "149"  # more than one batch of 100
    value = params["reward.judge_serve_command"]
    assert len(value) == validation.MAX_PARAM_VAL_LENGTH and value.startswith("x" * 5000)
    assert value.endswith("; whole in config.json]") and "7000 chars, sha256 " in value
    again = mlflow_run.Run("long-params", IDENTITY)  # a resume with one execution setting changed
    assert again.run_id == run.run_id and again.resumed
    again.log_config({**made, "s0": {"f": 9}})
    data = client(server).get_run(run.run_id).data
    assert data.params["s0.f"] == "0" and data.tags[mlflow_run.RESUMED_TAG + "s0.f"] == "9"


def test_preflight_opens_the_experiment_or_names_the_variable_and_the_fix(server, monkeypatch):
    cfg = config.from_dict({"logging": {"tracker": ["mlflow"], "mlflow_experiment": "preflight"}}, partial=True)
    check = preflight.check_mlflow(cfg)
    assert check.ok and "videogrpo:" not in check.detail and "***@127.0.0.1" in check.detail, check.detail
    monkeypatch.delenv(mlflow_run.URI_VAR)
    check = preflight.check_mlflow(cfg)
    assert not check.ok and "$MLFLOW_TRACKING_URI is not set: `export MLFLOW_TRACKING_URI=" in check.detail
    with pytest.raises(VideoGRPOError, match=r"drop mlflow from logging.tracker"):
        mlflow_run.Run("x", IDENTITY)
    monkeypatch.setenv(mlflow_run.URI_VAR, "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    check = preflight.check_mlflow(cfg)
    assert not check.ok and "MLflow at http://127.0.0.1:9 ($MLFLOW_TRACKING_URI): cannot open" in check.detail


def test_a_dry_run_with_mlflow_and_no_uri_stops_naming_the_variable(workdir, monkeypatch):
    monkeypatch.delenv(mlflow_run.URI_VAR, raising=False)
    out = run_in(["snakemake", "-n", "--config", "logging={tracker: [mlflow]}"], workdir, check=False)
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "$MLFLOW_TRACKING_URI is not set: `export MLFLOW_TRACKING_URI=http://<host>:<port>`" in said, said[-3000:]
    assert "Traceback" not in said


@pytest.mark.parametrize(
    "logging, message",
    [
        ({"tracker": ["wandb", "mlflow"], "wandb_mode": "disabled"}, "write logging.tracker: [mlflow] (no W&B)"),
        ({"tracker": ["mlflow"], "wandb_mode": "online"}, "no W&B run is made; add wandb to logging.tracker"),
        ({"tracker": ["none", "mlflow"]}, "`none` means no tracker, so it stands alone"),
        ({"tracker": []}, "write [none] for none"),
        ({"tracker": ["neptune"]}, "'neptune' is not one of wandb, mlflow, none"),
        ({"tracker": ["mlflow", "mlflow"]}, "'mlflow' is listed twice"),
    ],
)
def test_contradictory_tracker_settings_are_refused(logging, message):
    with pytest.raises(VideoGRPOError, match="logging") as err:
        config.from_dict({"logging": logging}, partial=True)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "logging, wandb, mlflow",
    [
        ({}, True, False),  # the default: W&B, offline
        ({"wandb_mode": "disabled"}, False, False),  # as before the list: no W&B, no tracker
        ({"tracker": ["none"]}, False, False),
        ({"tracker": ["mlflow"]}, False, True),
        ({"tracker": ["wandb", "mlflow"], "wandb_mode": "online"}, True, True),
    ],
)
def test_which_trackers_a_setting_selects(logging, wandb, mlflow):
    log = config.from_dict({"logging": logging}, partial=True).logging
    assert (config.uses_tracker(log, "wandb"), config.uses_tracker(log, "mlflow")) == (wandb, mlflow)


def test_validation_points_reach_mlflow_once_across_a_resume(server, tmp_path):
    """Validation records (train.validate_*: `val/*` keys at the step of the update they follow, 0 before
    training) through the Tracker: a resumed tracker does not send a point the run holds again, and sends a new one."""
    from videogrpo.grpo.tracking import Tracker

    logging = config.from_dict({"logging": {"tracker": ["mlflow"], "mlflow_experiment": "validation"}}, partial=True)

    first = Tracker(tmp_path / "metrics.jsonl", 2, logging.logging, IDENTITY, tmp_path, {}, enabled=True)
    first.record_validation(validation_point(0, 0.5))
    first.record_validation(validation_point(1, 0.6, gold=0.3))  # with a gold reward (train.validate_rewards)
    first.close()
    resumed = Tracker(tmp_path / "metrics.jsonl", 2, logging.logging, IDENTITY, tmp_path, {}, enabled=True)
    resumed.trim(1)  # a resume from update 1's checkpoint keeps both points
    resumed.record_validation(validation_point(1, 0.7))  # were it redone, MLflow keeps the first value
    resumed.record_validation(validation_point(2, 0.8))
    resumed.close()
    c = client(server)
    run_id = mlflow_run.Run("validation", IDENTITY).run_id
    for key, want in [
        ("val/reward_mean", [(0, 0.5), (1, 0.6), (2, 0.8)]),
        ("val/reward/task_a", [(0, 0.5), (1, 0.6), (2, 0.8)]),
        ("val/vbvr_vlm/reward_mean", [(1, 0.3)]),
        ("val/vbvr_vlm/reward/task_a", [(1, 0.3)]),
        ("val/vbvr_vlm/reward_errors", [(1, 1)]),
        ("val/divergence_alarm", [(1, 0)]),
    ]:
        assert sorted((m.step, m.value) for m in c.get_metric_history(run_id, key)) == want
    assert c.get_metric_history(run_id, "val/vbvr_vlm/reward_stderr") == []  # None (one prompt scored): not sent
    assert c.get_metric_history(run_id, "step") == []  # the update count (resumes' last_step) is the updates' own
    assert [m["step"] for m in metrics(tmp_path)] == [0, 1, 1, 2]
