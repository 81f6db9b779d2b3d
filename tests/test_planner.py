"""`videogrpo plan`: the layouts of a recipe's training contract on the GPUs a user has, each planned by preflight's
memory plan and timed by a stated model; the written layer passes the workflow's checks; bad input gets one line;
the time model against the only GPU measurements of this training code (docs/what-fits.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import doc_commands
import pytest
import yaml

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.preflight import measured, memory_plan, planner

from conftest import REPO

VIDEOGRPO = str(Path(sys.executable).parent / "videogrpo")
RECIPE = "config/recipes/rl_5b_cps.yaml"


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    argv = ["videogrpo", "plan", *args]
    out = subprocess.run([VIDEOGRPO, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600)
    doc_commands.record(argv, out.returncode)
    return out


def rows(stdout: str) -> dict[str, str]:
    """The printed rows by their index (1, 2, ... for fitting layouts, c1, ... for contract changes)."""
    return {m.group(1): line for line in stdout.splitlines() if (m := re.match(r" +(\d+|c\d+) (\S.*)", line))}


def load(recipe: str, overrides: dict | None = None, *layers: Path) -> config.Config:
    return config.load([REPO / "config/config.yaml", REPO / f"config/recipes/{recipe}.yaml", *layers], overrides)


def test_the_5b_recipe_on_8_gpus_of_80_gib_and_its_written_layer(tmp_path):
    layer = tmp_path / "eight.yaml"
    out = run("--configfile", RECIPE, "--gpus", "8", "--gpu-memory", "80", "--write", str(layer))
    assert out.returncode == 0, out.stdout + out.stderr
    shown = rows(out.stdout)
    assert list(shown)[:5] == ["1", "2", "3", "4", "5"], out.stdout
    # The released contract: 32 prompts of 32 members on 8 ranks, 4 prompts a rank; every assumption printed.
    assert all(" 4 x 32 " in line for line in shown.values()), out.stdout
    for option in ("--mfu", "--video-overhead-s", "--nvlink-gbps", "--network-gbps", "--pcie-gbps"):
        assert option in out.stdout
    assert re.search(r"nearest that do not fit:\n.*\n\s+breaks: device: peak [\d.]+ GiB > 80.00 GiB", out.stdout)
    # The layer changes only the layout; preflight's plan for it (the same function, the same shape) is row 1's.
    written = yaml.safe_load(layer.read_text())
    assert set(written) == {"parallel", "grpo", "train"}
    assert set(written["grpo"]) == {"sample_batch_size", "decode_batch_size"}
    cfg = load("rl_5b_cps", None, layer)
    plan = memory_plan.plan_for_config(cfg, planner.released_shape(cfg))
    first = shown["1"].split()
    rollout, replay = (float(v) for v in re.search(r"x 32\s+([\d.]+)\s+([\d.]+)", shown["1"]).groups())
    assert rollout == round(plan.phase_total(memory_plan.ROLLOUT) / memory_plan.GIB, 1), first
    assert replay == round(plan.phase_total(memory_plan.REPLAY) / memory_plan.GIB, 1), first
    assert f"peak {plan.peak / memory_plan.GIB:.2f} GiB" in layer.read_text() and plan.fits
    # Chunks, decode batch, checkpointing and offload are execution fields: the run is the recipe's on this topology.
    assert config.run_identity(cfg) == config.run_identity(load("rl_5b_cps", {"parallel": written["parallel"]}))
    # The workflow accepts it as written.
    argv = ["snakemake", "-n", "--configfile", RECIPE, str(layer)]
    dry = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), *argv[1:]], cwd=REPO, capture_output=True, text=True
    )
    doc_commands.record(argv, dry.returncode)
    assert dry.returncode == 0 and "preflight" in dry.stdout and "train" in dry.stdout, dry.stdout + dry.stderr


def test_one_gpu_fits_the_5b_contract_only_with_offload_and_contract_changes_are_labelled():
    out = run("--configfile", RECIPE, "--gpus", "1", "--gpu-memory", "80", "--contract-changes")
    assert out.returncode == 0, out.stdout + out.stderr
    shown = rows(out.stdout)
    fitting = [line for key, line in shown.items() if key.isdigit()]
    assert fitting and all("offload" in line and "optim" in line for line in fitting), out.stdout
    assert all(" 32 x 32 " in line for line in fitting)  # every prompt of the step on the one rank
    assert "contract changes that fit (each a new run, not the recipe's training):" in out.stdout
    assert re.search(r"\n\s+with train.lora_rank = 16", out.stdout), out.stdout


def test_a_world_size_the_waves_refuse_is_offered_the_prompts_per_step_it_takes(tmp_path):
    """3 GPUs cannot share 32 prompts a wave: no layout of the recipe runs, so the plan offers the nearest counts of
    prompts per step that 3 replicas can share (each a new run), and the picked one is a layer the workflow takes."""
    layer = tmp_path / "three.yaml"
    out = run("--configfile", RECIPE, "--gpus", "3", "--write", str(layer), "--pick", "c1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no layout of rl_5b_cps runs on 3 GPU(s): world size 3" in out.stdout
    assert "contract changes that fit (each a new run, not the recipe's training):" in out.stdout
    assert re.search(r"with grpo.prompts_per_step = 30 \(a multiple of 3 replicas\)", out.stdout), out.stdout
    assert yaml.safe_load(layer.read_text())["grpo"]["prompts_per_step"] == 30
    assert load("rl_5b_cps", {"parallel": {"procs_per_node": 3}}, layer).grpo.prompts_per_step == 30


def test_contract_changes_that_do_not_fit_are_not_listed_as_fitting():
    out = run("--configfile", RECIPE, "--gpus", "1", "--gpu-memory", "20", "--contract-changes")
    assert out.returncode == 2 and "    none fits" in out.stdout, out.stdout + out.stderr
    assert "contract changes that fit" not in out.stdout
    assert "contract changes that do not fit either: train.lora_rank = 64; " in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "--gpus 0: give at least 1 GPU"),
        (
            ["--gpus", "1", "--gpu-memory", "16"],
            "--gpu-memory 16: a GPU is smaller than its share of the float32 master weights, 4 B x 4,999,787,712 "
            "parameters / 1 GPU(s) = 18.6 GiB",
        ),
        (
            ["--gpus", "8", "--gpu", "tpu", "--gpu-memory", "80"],
            "--gpu tpu: not a GPU the planner knows (its bf16 peak and memory); give one of a100, a800, b200, h100, "
            "h200, h800, l40s, the nearest to yours, with --gpu-memory GIB for its memory",
        ),
        (["--gpus", "8", "--nodes", "3"], "--nodes 3: must be at least 1 and divide --gpus 8"),
    ],
)
def test_bad_input_gets_one_line_and_nothing_is_written(args, message, tmp_path):
    out = run("--configfile", str(REPO / RECIPE), *args, "--write", str(tmp_path / "layer.yaml"), cwd=tmp_path)
    assert out.returncode == 3 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert list(tmp_path.iterdir()) == []  # no layer, no results/


def test_tensor_parallel_with_shared_prompt_waves_is_refused_by_the_config_check():
    """A TP group must roll out the same rows, and shared-prompt waves are dealt per rank."""
    with pytest.raises(ConfigError, match="grpo.shared_prompts = true with parallel.tensor_parallel = 2"):
        load("rl_5b_cps", {"parallel": {"nodes": 1, "tensor_parallel": 2, "data_parallel": "fsdp"}})


def test_the_time_model_is_within_1_5x_of_every_measured_step_and_the_docs_show_both():
    page = (REPO / "docs/what-fits.md").read_text()
    for run, seconds, peak in measured.against_measurements(lambda r, o: load(r, o)):
        line = measured.measurement_row(run, seconds, peak)
        assert line in page, line  # the docs table is what the model gives today
        if seconds is not None:
            assert 1 / 1.5 <= seconds / run.step_s <= 1.5, (run.label, seconds)


# config/hardware: (recipe, layer, the ranks simulated with a rollout and a replay step on fake tensors)
HARDWARE = [
    ("rl_5b_cps", "5b_8x80gb", "7"),
    ("rl_5b_cps", "5b_16x80gb", None),
    ("rl_a14b_rule", "a14b_8x80gb", None),
    ("rl_5b_cps", "5b_1x80gb_lora", None),
]


@pytest.mark.parametrize(("recipe", "layer", "steps"), HARDWARE, ids=[h[1] for h in HARDWARE])
def test_each_hardware_layer_simulates_at_its_world_size_as_planned(recipe, layer, steps):
    """torch's sharding at the layer's world size gives every simulated rank the bytes the plan gives it (and a
    rollout and a replay step run on fake tensors for one rank); docs/what-fits.md lists the layer with its plan."""
    path = REPO / f"config/hardware/{layer}.yaml"
    cfg = load(recipe, None, path)
    plan = memory_plan.plan_for_config(cfg, planner.released_shape(cfg))
    assert plan.fits and plan.available == 80 * memory_plan.GIB
    header = path.read_text().splitlines()[0]
    assert f"peak {plan.peak / memory_plan.GIB:.2f} GiB" in header, header  # the layer says what it was planned at
    argv = [VIDEOGRPO, "simulate", "--configfile", f"config/recipes/{recipe}.yaml"]
    argv += [f"config/hardware/{layer}.yaml", *(["--ranks", steps] if steps else ["--no-steps"])]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    doc_commands.record(["videogrpo", *argv[1:]], out.returncode)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"of {cfg.world_size} checked" in out.stdout and "!= plan" not in out.stdout
    if steps:
        assert "AdamW step" in out.stdout
    row = next(line for line in (REPO / "docs/what-fits.md").read_text().splitlines() if f"`{layer}`" in line)
    assert f"{plan.peak / memory_plan.GIB:.1f} GiB" in row, row


def test_actor_splits_are_planned_with_both_parts_of_the_time():
    """`--actors` on 2 nodes of 8: one node trains (its best layout as a job of 8), the other rolls out. The line
    gives the synchronous time as the sum of the two parts and the asynchronous one as the longer, at the staleness
    of the automatic prefetch, and the actor's peak, which its own memory plan gives (the command
    docs/options.md#rollout-actors shows)."""
    from videogrpo.grpo import actor_schedule
    from videogrpo.preflight import actor_memory

    out = run("--configfile", RECIPE, "--gpus", "16", "--nodes", "2", "--top", "1", "--actors")
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("  train nodes 1: 8 GPU(s) train, 8 roll out")]
    sync, asynchronous, stale, prefetch, train, actor, peak = re.search(
        r": (\d+) s/update synchronous, (\d+) s asynchronous at staleness (\d+) \(prefetch (\d+)\); train part (\d+) "
        r"s, actors' (\d+) s; an actor's peak ([\d.]+) GiB",
        line,
    ).groups()
    assert abs(int(sync) - int(train) - int(actor)) <= 1 and int(asynchronous) == max(int(train), int(actor))
    chunk = re.search(r"\(\w+[^,]*, chunk (\d+|wave),", line).group(1)
    layer = {"parallel": {"nodes": 2, "procs_per_node": 8}, "actors": {"train_nodes": 1, "asynchronous": True}}
    layer["grpo"] = {"sample_batch_size": None if chunk == "wave" else int(chunk)}
    cfg = config.load([REPO / "config/config.yaml", REPO / RECIPE], layer)
    assert int(prefetch) == actor_schedule.prefetch(cfg) and int(stale) == int(prefetch) - 1
    assert float(peak) > 0 and actor_memory.actor_plan(cfg, planner.released_shape(cfg)).peak > 0
