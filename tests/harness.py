"""Running the trainer in tests: under torchrun (real worker processes, gloo) or in this process (a world of one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from conftest import FRAMES, REPO, SIDE

TINY = yaml.safe_load((REPO / "config/config.yaml").read_text())


def trainer_config(**sections) -> dict:
    """The tiny default on the session's 3-sample tasks (one held out), sections updated as given."""
    cfg = json.loads(json.dumps(TINY))
    cfg["evalkit"]["path"] = str(REPO / cfg["evalkit"]["path"])
    cfg["data"]["samples_per_task"], cfg["data"]["heldout_per_task"] = 3, 1
    cfg["logging"] = {"wandb_mode": "disabled"}
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def data_stage(tmp_path: Path, name: str, *args: str, **data: object) -> subprocess.CompletedProcess:
    """`videogrpo stage <name>` on a small synthetic dataset, as its rule runs it (`data` fields override)."""
    data = {
        "source": "synthetic",
        "task_list": str(REPO / "config/tasks/synthetic.txt"),
        "samples_per_task": 2,
        "heldout_per_task": 1,
        "gt_frames": FRAMES,
        "gt_height": SIDE,
        "gt_width": SIDE,
        **data,
    }
    argv = [str(Path(sys.executable).parent / "videogrpo"), "stage", name, "--config-json", json.dumps({"data": data})]
    argv += [*args, "--manifest", str(tmp_path / f"{name}.manifest.json")]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))


def solo_config(**sections) -> dict:
    """A world of one rank: one prompt per step (shared-prompt waves must divide the world)."""
    cfg = trainer_config(parallel={"procs_per_node": 1}, grpo={"prompts_per_step": 1})
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def launch(
    cfg: dict,
    out: Path,
    tiny_model: Path,
    dataset: Path,
    worker: str = "videogrpo.grpo.worker",
    refiners: dict[str, Path] | None = None,
) -> subprocess.Popen:
    """torchrun of `worker` (a module: the trainer's, or tests/probe_worker.py's instrumented one); `refiners`:
    each prompt refiner's directory by name."""
    out.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={cfg['parallel']['procs_per_node']}",
        "-m",
        worker,
        "--config-json",
        json.dumps(cfg),
        "--run-id",
        "test",
        "--model",
        str(tiny_model),
        "--dataset",
        str(dataset),
        "--evalkit",
        cfg["evalkit"]["path"],
        "--checkpoints",
        str(out / "checkpoints"),
        "--final",
        str(out / "final"),
        "--metrics",
        str(out / "metrics.jsonl"),
        "--run-dir",
        str(out),
        *(f"--refiner={name}={path}" for name, path in (refiners or {}).items()),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PROBE_OUT=str(out))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        args, env=env, stdout=open(out / "log.txt", "a"), stderr=subprocess.STDOUT, start_new_session=True
    )


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process under it, as a node failure would. torchrun starts each worker in a
    session of its own, so killing torchrun's process group alone leaves the workers training."""
    import psutil

    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    os.killpg(proc.pid, signal.SIGKILL)
    for child in below:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(below, timeout=30)


def train(
    cfg: dict,
    out: Path,
    tiny_model: Path,
    dataset: Path,
    kill_when=None,
    worker: str = "videogrpo.grpo.worker",
    refiners: dict[str, Path] | None = None,
) -> bool:
    """Run under torchrun to the end (True), or SIGKILL the whole process group once kill_when(out) holds (False)."""
    proc = launch(cfg, out, tiny_model, dataset, worker, refiners)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if kill_when is not None and kill_when(out):
            kill_tree(proc)
            return False
        time.sleep(0.05)
    if proc.poll() is None:
        kill_tree(proc)
    assert proc.returncode == 0, (out / "log.txt").read_text()[-5000:]
    return True


def trainer_in_process(
    cfg: dict,
    out: Path,
    tiny_model: Path,
    dataset: Path,
    inputs: dict | None = None,
    world_size: int = 1,
    refiners: dict[str, Path] | None = None,
):
    """A Trainer of a world of one in this process (no torchrun): for options that need no second rank.

    The caller runs it (`.run()`, which closes its scorer pool) or closes it (`.scorer.close()`). A
    `world_size` above one makes rank 0 of a larger world that joined no process group: enough to
    construct it and ask how it would resume, not to train.
    """
    import torch

    from videogrpo import config
    from videogrpo.grpo.trainer import Trainer, TrainPaths
    from videogrpo.parallel import process_groups

    resolved = config.from_dict(cfg)
    torch.set_num_threads(resolved.parallel.cpu_threads)  # what process_groups.init does in a worker
    paths = TrainPaths.under(out, tiny_model, dataset, Path(cfg["evalkit"]["path"]))
    paths.input_digests = inputs or {}
    paths.refiners = dict(refiners or {})
    return Trainer(resolved, paths, process_groups.Context(0, world_size, 0, torch.device("cpu")), "test")


def model_with_scheduler(model: Path, out: Path, scheduler: dict | None) -> Path:
    """The pipeline `model` (linked, not copied) with another scheduler config (None: none at all)."""
    out.mkdir(parents=True)
    for part in model.iterdir():
        if part.name != "scheduler":
            (out / part.name).symlink_to(part)
    if scheduler is not None:
        (out / "scheduler").mkdir()
        (out / "scheduler/scheduler_config.json").write_text(json.dumps(scheduler))
    return out


def train_in_process(cfg: dict, out: Path, tiny_model: Path, dataset: Path) -> Path:
    trainer_in_process(cfg, out, tiny_model, dataset).run()
    return out


def weights(out: Path) -> bytes:
    return (out / "final/transformer/diffusion_pytorch_model.safetensors").read_bytes()


def tensors(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "final/transformer/diffusion_pytorch_model.safetensors")


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def without_times(rows: list[dict]) -> list[dict]:
    """Metrics lines without their wall-clock fields (`time_`), which no two runs share."""
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


def layout(out: Path) -> dict:
    return json.loads((out / "final/training_state.json").read_text())["layout"]


def adam_tolerance(lr: float, updates: int) -> float:
    """How far two runs may drift when only the order of a gradient reduction differs.

    AdamW normalises each parameter's step by its own gradient scale, so a rounding difference in a
    near-zero gradient can move that parameter by up to lr per update; a tenth of that bound has held.
    """
    return 0.1 * lr * updates


def report_tables(page: str) -> list[list[list[str]]]:
    """The data tables of an HTML report page (plain, or of class `data`): rows of cell texts, the header row
    first."""
    import html
    import re

    tables = []
    for body in re.findall(r"<table(?: class='data')?>(.*?)</table>", page, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
        tables.append([[html.unescape(c) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", row, re.S)] for row in rows])
    return tables


def assert_table_shows_csv(shown: list[list[str]], rows: list[dict]) -> None:
    """A rendered table (header first) holds exactly the CSV's columns and rows, numbers to 4 decimals."""
    assert shown[0] == list(rows[0]) and len(shown) == len(rows) + 1
    for got, want in zip(shown[1:], rows):
        for cell, value in zip(got, want.values(), strict=True):
            try:
                assert abs(float(cell) - float(value)) <= 5e-5, (cell, value)
            except ValueError:
                assert cell == value, (cell, value)


def assert_check_shows_csv(shown: list[list[str]], rows: list[dict]) -> None:
    """The report's held-out check (header first: task, samples, one `mean ± se` column per model, then the trained
    model's `delta [low, high]`) holds exactly the per-task CSV's rows of the check, numbers to 4 decimals."""
    from videogrpo.provenance.report_page import CHECK_CHANGE

    def same(text: str, value: str) -> bool:  # an empty CSV cell (no interval below two samples) is a dash
        return text == "–" if value == "" else abs(float(text) - float(value)) <= 5e-5

    header, body = shown[0], shown[1:]
    models = list(dict.fromkeys(row["model"] for row in rows))
    tasks = list(dict.fromkeys(row["task"] for row in rows))
    assert header[: 2 + len(models)] == ["task", "samples", *models] and [line[0] for line in body] == tasks
    for row in rows:
        line = body[tasks.index(row["task"])]
        mean, se = line[2 + models.index(row["model"])].split(" ± ")
        assert line[1] == row["samples"] and same(mean, row["mean"]) and same(se, row["se"]), (line, row)
        if row.get("delta_vs_base"):
            delta, interval = line[header.index(CHECK_CHANGE)].split(" [")
            low, high = interval.removesuffix("]").split(", ")
            assert same(delta, row["delta_vs_base"]), (line, row)
            assert same(low, row["delta_ci_low"]) and same(high, row["delta_ci_high"]), (line, row)
    assert (CHECK_CHANGE in header) == any(row.get("delta_vs_base") for row in rows)


def validation_point(step: int, mean: float, gold: float | None = None) -> dict:
    """A validation record as the trainer hands it to the Tracker (`val/*` keys at the step of the update they
    follow, 0 before training), for the trackers' tests; `gold`: with a gold reward's keys (train.validate_rewards:
    its mean, per task and per prompt, and the alarm's)."""
    found = {
        "step": step,
        "val/reward_mean": mean,
        "val/reward_std": 0.1,
        "val/reward_per_task": {"task_a": mean},
        "val/reward_errors": 0,
        "val/prompts": 2,
        "val/time_s": 1.0,
    }
    if gold is not None:
        found.update({
            "val/reward_scores": [mean, mean],
            "val/vbvr_vlm/reward_mean": gold,
            "val/vbvr_vlm/reward_stderr": None,
            "val/vbvr_vlm/reward_per_task": {"task_a": gold},
            "val/vbvr_vlm/reward_scores": [gold, None],
            "val/vbvr_vlm/reward_errors": 1,
            "val/divergence": [],
            "val/divergence_alarm": 0,
            "val/divergence_first_update": None,
        })  # fmt: skip
    return found
