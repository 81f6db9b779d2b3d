"""What each stage cost, as its manifest records it (provenance/cost.py), and the trace built from the
manifests (provenance/trace.py): rows, TSV, sacct's final states, the cost change between two runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from videogrpo.provenance import cost, cost_page, slurm_job, trace
from videogrpo.provenance.manifest import StageRun, read_manifest
from videogrpo.provenance.verify import run_rows

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES")


# The manifest rounds wall_s to 3 decimals and gpu_h to 6, each from the unrounded wall time: a gpu_h
# recomputed from the rounded wall_s may differ by half a unit of each rounding, whatever the wall time.
def gpu_h_tolerance(gpus: int) -> float:
    return 0.5e-6 + gpus * 0.5e-3 / 3600 + 1e-12


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


@pytest.fixture
def outside_slurm(monkeypatch):
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)


def test_a_manifest_records_wall_cpu_of_its_children_and_no_gpu_on_cpu(tmp_path, outside_slurm):
    with StageRun("demo", tmp_path / "m.json", inputs={}):
        subprocess.run([sys.executable, "-c", BURN], check=True)  # waited for: RUSAGE_CHILDREN counts it
        time.sleep(0.2)
    manifest = read_manifest(tmp_path / "m.json")
    block = manifest["cost"]
    assert block["wall_s"] == manifest["duration_s"] >= 0.6
    assert block["cpu_s"] >= block["cpu_children_s"] >= 0.4 and block["cpu_h"] == pytest.approx(
        block["cpu_s"] / 3600, abs=1e-6
    )
    assert block["cpu_s"] < block["wall_s"]  # the sleep is no CPU time
    assert (block["gpus"], block["gpu_h"], block["nodes"], block["state"]) == (0, 0.0, 1, "COMPLETED")
    assert block["gpus_from"] == "no CUDA device used, outside SLURM"


# A stage's process as SLURM starts it: below a process whose title is the job's slurmstepd (`exec -a` sets it as
# slurmstepd sets its own), which is what confirms the job (provenance/slurm_job.py).
UNDER_STEPD = """
import sys, time
from videogrpo.provenance.manifest import StageRun
with StageRun("evaluate", sys.argv[1], inputs={}):
    time.sleep(0.1)
"""


def test_a_stage_in_a_slurm_job_counts_the_gpus_of_its_allocation(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    script = tmp_path / "stage.py"
    script.write_text(UNDER_STEPD)
    stepd = f"exec -a 'slurmstepd: [4242.batch]' bash -c '{sys.executable} {script} {tmp_path / 'm.json'}; true'"
    subprocess.run(["bash", "-c", stepd], check=True)
    manifest = read_manifest(tmp_path / "m.json")
    block = manifest["cost"]
    assert manifest["slurm_job_id"] == "4242" and block["gpus"] == 2
    assert manifest["slurm_job"]["confirmed"] and "slurmstepd" in manifest["slurm_job"]["how"]
    assert block["gpu_h"] == pytest.approx(2 * block["wall_s"] / 3600, abs=gpu_h_tolerance(2))
    assert block["gpus_from"] == "the SLURM allocation of the job"


def test_a_slurm_job_id_slurm_does_not_confirm_is_recorded_as_a_claim_and_bills_nothing(tmp_path, monkeypatch):
    """`SLURM_JOB_ID=12345 snakemake ...` outside any allocation (or an old allocation's shell): the manifest keeps
    the claim and why SLURM did not confirm it, names no job, and counts no GPU of an allocation; the trace lists
    no SLURM job."""
    monkeypatch.setenv("SLURM_JOB_ID", "12345")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    with StageRun("report", tmp_path / "m.json", inputs={}):
        pass
    manifest = read_manifest(tmp_path / "m.json")
    assert manifest["slurm_job_id"] is None
    claim = manifest["slurm_job"]
    assert claim["claimed"] == "12345" and not claim["confirmed"] and "no slurmstepd of the job" in claim["how"]
    assert (manifest["cost"]["gpus"], manifest["cost"]["gpus_from"]) == (0, "no CUDA device used, outside SLURM")
    row = trace.job_row("report", manifest)
    assert row["job_id"] is None and row["job_claimed"] == "12345"
    assert cost.training_gpus(2, 4, "cuda", {"SLURM_JOB_ID": "12345", "SLURM_GPUS_ON_NODE": "8"})[0] == 8


def test_a_stage_that_declares_its_gpus_records_them(tmp_path, outside_slurm):
    with StageRun("train", tmp_path / "m.json", inputs={}) as stage:
        stage.nodes, stage.gpus = 2, cost.training_gpus(2, 4, "cuda", {})
        time.sleep(0.1)
    block = read_manifest(tmp_path / "m.json")["cost"]
    assert (block["nodes"], block["gpus"]) == (2, 8)
    assert block["gpu_h"] == pytest.approx(8 * block["wall_s"] / 3600, abs=gpu_h_tolerance(8))


@pytest.mark.parametrize("wall_s", [0.0, 0.1, 0.1004999, 0.1005, 3599.9995, 12345.6785])
def test_gpu_hours_come_from_the_unrounded_wall_time_within_both_roundings(wall_s):
    block = cost.cost_block(wall_s, (1.0, 0.5), 8, "declared")
    assert block["gpu_h"] == round(8 * wall_s / 3600, 6)  # not from the rounded wall_s
    assert block["gpu_h"] == pytest.approx(8 * block["wall_s"] / 3600, abs=gpu_h_tolerance(8))


@pytest.mark.parametrize(
    "value, count",
    [(None, None), ("", 0), ("NoDevFiles", 0), ("-1", 0), ("0", 1), ("0,1,2,3", 4), ("GPU-5a1f,GPU-77c0", 2)],
)
def test_cuda_visible_devices_is_counted_as_cuda_reads_it(value, count):
    assert cost.visible_devices({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == count


def test_training_gpus_are_nodes_times_the_gpus_of_each_node(monkeypatch):
    monkeypatch.setattr(slurm_job, "confirmed_job_id", lambda env: env.get("SLURM_JOB_ID"))  # as inside job 7
    slurm = {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert cost.training_gpus(16, 8, "cuda", slurm)[0] == 128  # the released 5B recipes' topology
    # The allocation is what is billed: more GPUs per node than ranks still count.
    assert cost.training_gpus(2, 4, "cuda", dict(slurm, SLURM_GPUS_ON_NODE="8"))[0] == 16
    assert cost.training_gpus(2, 4, "cuda", {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1"})[0] == 4
    assert cost.training_gpus(2, 4, "cuda", {}) == (8, "2 nodes x 4 ranks (parallel.procs_per_node), one GPU each")
    assert cost.training_gpus(1, 2, "cpu", slurm) == (0, "parallel.device = cpu: no GPU")


def manifest(stage, start, end, job=None, **block):
    """A manifest's fields the trace reads, as StageRun writes them."""
    wall = round(trace._seconds(end) - trace._seconds(start), 3)
    return {
        "stage": stage,
        "started_at": start,
        "ended_at": end,
        "duration_s": wall,
        "host": "node-a",
        "slurm_job_id": job,
        "cost": {"wall_s": wall, "cpu_h": 0.01, "gpus": 0, "gpus_from": "x", "gpu_h": 0.0, "state": "COMPLETED"}
        | block,
    }


T = "2026-12-01T10:00:{:02d}.000+00:00"


def fake_sacct(tmp_path, stdout: str, code: int = 0) -> str:
    """A stand-in for sacct that logs its arguments and answers in sacct's --parsable2 form."""
    script = tmp_path / "sacct"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/sacct.args\nprintf '{stdout}'\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def test_a_span_of_jobs_remade_at_different_times_says_how_much_of_it_jobs_ran():
    """The download two days before, the rest today: the span is no duration of the run, and the table says so."""
    stages = {
        "fetch_model": manifest("fetch_model", "2026-12-01T10:00:00.000+00:00", "2026-12-01T10:01:00.000+00:00"),
        "train": manifest("train", "2026-12-03T10:00:00.000+00:00", "2026-12-03T10:04:00.000+00:00"),
        "report": manifest("report", "2026-12-03T10:03:30.000+00:00", "2026-12-03T10:05:00.000+00:00"),
    }
    totals = trace.totals(trace.rows_of(stages, sacct=False))
    assert totals["span_s"] == 2 * 86400 + 300 and totals["busy_s"] == 360  # overlapping jobs counted once
    text = cost_page.span_text(totals)
    assert text.startswith("span 48 h 05 min") and "jobs ran in 6 min of it (made at different times" in text, text


def test_rows_take_sacct_final_states_and_keep_the_manifests_without_it(tmp_path, monkeypatch):
    stages = {
        "train": manifest("train", T.format(10), T.format(40), "101", gpus=16, gpu_h=0.1333),
        "fetch_model": manifest("fetch_model", T.format(0), T.format(5)),
        "evaluate": manifest("evaluate", T.format(41), T.format(50), "102"),
    }
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    fake_sacct(tmp_path, "101|COMPLETED\\n102|CANCELLED by 1000\\n")
    rows = trace.rows_of(stages)
    assert [r["name"] for r in rows] == ["fetch_model", "train", "evaluate"]  # by start
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED", "CANCELLED"]
    assert (tmp_path / "sacct.args").read_text().split() == [
        "--noheader",
        "--parsable2",
        "--allocations",
        "--format=JobIDRaw,State",
        "--jobs",
        "101,102",
    ]
    fake_sacct(tmp_path, "sacct: error: Slurm accounting storage is disabled\\n", code=1)
    assert [r["state"] for r in trace.rows_of(stages)] == ["COMPLETED"] * 3
    totals = trace.totals(rows)
    assert totals == {"jobs": 3, "wall_s": 44.0, "cpu_h": 0.03, "gpu_h": 0.1333, "span_s": 50.0, "busy_s": 44.0}
    assert cost_page.span_text(totals) == "span 50 s"  # jobs ran most of it: the span is the run's time
    lines = trace.tsv(rows).splitlines()
    assert lines[0].split("\t") == list(trace.COLUMNS)
    assert lines[1].split("\t") == ["fetch_model", "-", "COMPLETED", "node-a", T.format(0), T.format(5)] + [
        "5",
        "0.01",
        "0",
        "0",
    ]
    assert [line.split("\t")[1:3] for line in lines[2:]] == [["101", "COMPLETED"], ["102", "CANCELLED"]]


def test_a_manifest_from_before_the_cost_block_shows_as_unknown():
    old = manifest("train", T.format(0), T.format(30))
    del old["cost"]
    (row,) = trace.rows_of({"train": old}, sacct=False)
    assert (row["wall_s"], row["cpu_h"], row["gpus"], row["state"]) == (30.0, None, None, "COMPLETED")
    assert trace.totals([row])["cpu_h"] is None
    assert trace.tsv([row]).splitlines()[1].split("\t")[6:] == ["30", "-", "-", "-"]


def test_the_cost_change_lists_the_totals_and_the_jobs_that_differ():
    shared = manifest("fetch_model", T.format(0), T.format(5))
    a = trace.rows_of({"fetch_model": shared, "train": manifest("train", T.format(6), T.format(46))}, sacct=False)
    b = trace.rows_of({"fetch_model": shared, "train": manifest("train", T.format(6), T.format(26))}, sacct=False)
    lines = trace.cost_lines(a, b)
    assert lines == [
        "  total: wall 45.0 | 25.0 s (-44.4 %), CPU 0.0200 | 0.0200 h (+0.0 %), GPU 0.0000 | 0.0000 h",
        "  train: wall 40.0 | 20.0 s (-50.0 %), CPU 0.0100 | 0.0100 h (+0.0 %), GPU 0.0000 | 0.0000 h",
    ]


def test_the_trace_of_a_run_directory_names_each_manifest_as_the_workflow_lists_it(tmp_path, outside_slurm):
    results = tmp_path / "results"
    run = results / "runs/tiny-0123456789ab"
    shared = results / "models/tiny/fetch_model.manifest.json"
    cells = [results / f"matrix/k/{m}/unipc/generate_cell.manifest.json" for m in ("base", "trained")]
    for path in (shared, *cells):
        with StageRun(path.name.split(".")[0], path, inputs={}):
            pass
    with StageRun("train", run / "train.manifest.json", inputs={}, upstream=[shared, *cells]):
        pass
    rows = run_rows(run, sacct=False)  # no stage list: names from the layout
    names = ["fetch_model", "generate_cell:base:unipc", "generate_cell:trained:unipc", "train"]
    assert sorted(r["name"] for r in rows) == names
    listed = {
        "fetch_model": str(shared),
        "generate_cell:base:unipc": str(cells[0]),
        "generate_cell:trained:unipc": str(cells[1]),
        "train": str(run / "train.manifest.json"),
    }
    (results / ".stage-config").mkdir()
    (results / ".stage-config/tiny-0123456789ab.stages.json").write_text(json.dumps(listed))
    rows = run_rows(run, sacct=False)
    assert sorted(r["name"] for r in rows) == sorted(listed)
    assert rows[-1]["name"] == "train"  # it started last
    for row in rows:
        block = read_manifest(listed[row["name"]])["cost"]
        assert (row["wall_s"], row["cpu_h"], row["gpus"], row["job_id"]) == (block["wall_s"], block["cpu_h"], 0, None)


def test_the_timeline_axis_is_linear_and_cuts_only_a_long_idle_gap():
    from videogrpo.provenance.cost_page import BREAK_SHARE, axis_of, duration_text, tick_step

    ax = axis_of([(0, 45), (50, 90), (190, 300)])  # 100 s idle: shorter than the busy time, kept
    assert ax.breaks == [] and ax.shown == 300
    assert [ax(t) for t in (0, 45, 150, 300)] == [0, 45 / 300, 150 / 300, 1]
    day = 86400.0
    ax = axis_of([(0, 45), (45, 90), (2 * day, 2 * day + 1000)])  # a download another run left two days before
    assert ax.breaks == [(90, 2 * day)]
    shown_break = BREAK_SHARE * 1090
    assert ax.shown == pytest.approx(1090 + shown_break)
    assert ax(90) == pytest.approx(90 / ax.shown) and ax(2 * day) == pytest.approx((90 + shown_break) / ax.shown)
    assert ax(2 * day + 500) - ax(2 * day) == pytest.approx(500 / ax.shown)  # linear again after the break
    assert ax(2 * day + 1000) == pytest.approx(1)
    points = [ax(t) for t in (0, 45, 90, day, 2 * day, 2 * day + 1, 2 * day + 1000)]
    assert points == sorted(points)
    assert [tick_step(s) for s in (5, 59, 600, 7 * 3600)] == [1, 10, 120, 3600]
    shown = [duration_text(s) for s in (0.2, 10, 42.54, 185, 300, 7620, 7200)]
    assert shown == ["0.2 s", "10 s", "42.5 s", "3 min 05 s", "5 min", "2 h 07 min", "2 h"]
