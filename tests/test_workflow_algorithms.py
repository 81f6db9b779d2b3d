"""The algorithms side by side (docs/options.md#comparing-algorithms): the demo's run (the reference's GRPO) and
Flow-GRPO-Fast, DiffusionNFT, GRPO-Guard, MixGRPO and MixGRPO-Flash as their authors run them (config/algorithms),
each trained end to end to its report by snakemake on the tiny default, then one comparison page of them all
(`videogrpo compare`). After tests/test_workflow.py, whose tests read the demo's run as the only one."""

from __future__ import annotations

import json
import re

import pytest
from demo import NEW_RUN_JOBS, SAMPLERS, first_run_id, jobs_run, run

pytestmark = pytest.mark.e2e

# The presets compared, each with the sampler of its held-out check (outside the matrix's samplers), its new cells and
# an option its report names: the trained model under the matrix's samplers and the check's pair, and the base model
# under the matrix's samplers again where the preset generates otherwise than every run before it (Flow-GRPO-Fast: 10
# steps; DiffusionNFT: the same; GRPO-Guard: guidance 4.5; MixGRPO: 25 steps; MixGRPO-Flash: MixGRPO's, so its
# check's base cell too).
PRESETS = {
    "flow_grpo_fast": ("flowcps-0.8", len(SAMPLERS) + 2 + len(SAMPLERS), "grpo.sde_window_size = 3"),
    "diffusion_nft": ("dpm_solver", len(SAMPLERS) + 2, "grpo.algorithm = &quot;nft&quot;"),
    "grpo_guard": ("flowgrpo_sde-0.7", len(SAMPLERS) + 2 + len(SAMPLERS), "grpo.grpo_guard = true"),
    "mixgrpo": ("flowgrpo_sde-0.7", len(SAMPLERS) + 2 + len(SAMPLERS), "grpo.sde_window_size = 4"),
    "mixgrpo_flash": ("flowgrpo_sde-0.7", len(SAMPLERS) + 1, "grpo.sde_window_tail = &quot;dpm_solver&quot;"),
}
BASE = {"mixgrpo_flash": "mixgrpo"}
"""The preset a preset is layered after."""


def new_run(workdir, overrides: str | list[str] = (), cells: int = len(SAMPLERS), preset: str | None = None) -> str:
    """A run of the tiny default with `overrides` (and an algorithm preset layered after it): its stages and its
    `cells` new matrix cells (the trained model under the matrix's two samplers; a training sampler outside them adds
    the held-out check's two)."""
    before = {p.name for p in (workdir / "results/runs").iterdir()}
    overrides = [overrides] if isinstance(overrides, str) else list(overrides)
    presets = [*([BASE[preset]] if preset in BASE else []), preset] if preset else []
    layers = ["--configfile", "config/config.yaml", *(f"config/algorithms/{p}.yaml" for p in presets)] if preset else []
    out = run(["snakemake", "--cores", "2", *layers, *(["--config", *overrides] if overrides else [])], workdir)
    assert "warning: grpo." not in out.stderr  # a preset neuters nothing
    assert jobs_run(out.stdout + out.stderr) == dict(NEW_RUN_JOBS, generate_cell=cells, score_cell=cells)
    (made,) = {p.name for p in (workdir / "results/runs").iterdir()} - before
    assert (workdir / "results/runs" / made / "report/report.html").is_file()
    return made


def test_the_algorithms_train_to_their_reports_and_compare_on_one_page(demo, workdir):
    grpo = first_run_id(workdir)
    # DiffusionNFT's run also evaluates the moving average of its weights (train.ema_decay, as its authors evaluate):
    # its ema/ export under the matrix's samplers.
    averaged = {"diffusion_nft": (["matrix={models: [base, trained, ema]}"], len(SAMPLERS))}
    made = {
        preset: new_run(workdir, averaged.get(preset, ((), 0))[0], cells + averaged.get(preset, ((), 0))[1], preset)
        for preset, (_, cells, _) in PRESETS.items()
    }
    nft = made["diffusion_nft"]
    runs = [f"results/runs/{name}" for name in (grpo, *made.values())]
    for preset, name in made.items():
        assert PRESETS[preset][2] in (workdir / "results/runs" / name / "report/report.html").read_text(), preset

    manifest = json.loads((workdir / "results/runs" / nft / "train.manifest.json").read_text())
    assert "ema" in manifest["outputs"] and manifest["summary"]["ema"]["blends"] == manifest["summary"]["updates"]
    assert {p.parent.name for p in (workdir / "results/matrix").glob(f"*/{nft}-ema/*/scores.csv")} == set(SAMPLERS)

    out = run(["videogrpo", "compare", *runs, "--out", "comparison.html"], workdir)
    lines = out.stdout.splitlines()
    # Each run's held-out check under its own training sampler, with its paired interval.
    for name, sampler in ((grpo, "flowcps-0.7"), *zip(made.values(), (s for s, *_ in PRESETS.values()))):
        line = rf"{name}: held-out trained - base [+-]\d\.\d{{4}} \[.+\] \({sampler}\)$"
        assert any(re.match(line, x) for x in lines), lines
    # The paired difference from the first run under each of the two samplers every matrix evaluated.
    paired = [x for x in lines if f" - {grpo} (" in x]
    assert len(paired) == len(PRESETS) * len(SAMPLERS), lines
    assert {re.search(r"\((\S+)\)", x).group(1) for x in paired} == set(SAMPLERS)
    assert sum("modelled GPU-h" in x and "s per update" in x for x in lines) == 1 + len(PRESETS)
    # Each run named by the preset it trained by (the demo's by none).
    assert [x for x in lines if "algorithm preset" in x] == [
        f"{name}: algorithm preset {preset}" for name, preset in zip((grpo, *made.values()), ("-", *PRESETS))
    ]
    page = (workdir / "comparison.html").read_text()
    for section in ("What differs", "Held-out change against the base model", "Paired difference between the runs",
                    "Reward per update and per modelled GPU-hour"):  # fmt: skip
        assert section in page
    for field in ("grpo.algorithm", "grpo.sde_window_size", "grpo.grpo_guard", "grpo.sampler"):
        assert f"<th>{field}</th>" in page
    assert "data:image/png;base64," in page

    # A file changed since its manifest recorded it is named, and no page is written.
    metrics = workdir / runs[1] / "train/metrics.jsonl"
    kept = metrics.read_bytes()
    try:
        metrics.write_bytes(kept + b"\n")
        out = run(["videogrpo", "compare", *runs, "--out", "changed.html"], workdir, check=False)
    finally:
        metrics.write_bytes(kept)
    assert out.returncode != 0, out.stdout
    assert f"{runs[1]}/train/metrics.jsonl" in out.stderr and "sha256" in out.stderr, out.stderr
    assert not (workdir / "changed.html").exists()


def test_a_run_with_a_gold_reward_reports_the_alarm_and_evaluates_its_best_point(demo, workdir):
    """The demo trained on the rule reward with the judge (demo.stand_in_judge at reward.judge_endpoint) as its
    gold reward and train.keep_best_by: best/ beside final/, the matrix's `best` row, and a report whose first
    screen says whether the alarm fired and which draws both rewards."""
    import json

    from videogrpo.demo.stand_in_judge import JudgeServer

    gold = ("train={validate_before_training: true, validate_every: 1, validate_prompts: 2, "
            "validate_rewards: [vbvr_vlm], keep_best_by: vbvr_vlm}")  # fmt: skip
    with JudgeServer() as server:
        # best/ under the matrix's samplers, and the held-out check's trained cell (the base cell is the demo's)
        cells = len(SAMPLERS) + 1
        judged = f"reward={{judge_endpoint: '{server.endpoint}'}}"
        made = new_run(workdir, [gold, judged, "matrix={models: [best]}"], cells)
        assert server.counts["answered"] >= 3 * 2  # the validation points' videos (3 points of 2 prompts)
    run_dir = workdir / "results/runs" / made
    best = json.loads((run_dir / "train/best/best.json").read_text())
    manifest = json.loads((run_dir / "train.manifest.json").read_text())
    assert manifest["summary"]["best"]["update"] == best["update"] and "best" in manifest["outputs"]
    page = (run_dir / "report/report.html").read_text()
    assert "Divergence alarm" in page and "Gold rewards and the divergence alarm" in page
    assert f"best/ holds the weights after update {best['update']}" in page
    assert "val/vbvr_vlm/reward_mean" in page
    assert list((workdir / "results/matrix").glob(f"*/{made}-best/unipc/scores.csv"))


def test_a_prompt_refiner_trains_with_the_generator_to_the_report(demo, workdir):
    """The tiny default with a tiny prompt refiner (config/refiners/tiny.yaml, docs/options.md#prompt-refiners): its
    download is its own stage, with digests; training reads it (the train manifest lists it and its digest); final/
    holds the trained refiner and each batch's rewrites, whose digests the metrics record; the report names the
    option."""
    import hashlib

    from safetensors.torch import load_file

    before = {p.name for p in (workdir / "results/runs").iterdir()}
    command = ["snakemake", "--cores", "2", "--configfile", "config/config.yaml", "config/refiners/tiny.yaml"]
    out = run(command, workdir)
    # The matrix's trained generator alone, behind the base refiners and behind the trained ones, each sampler.
    cells = 3 * len(SAMPLERS)
    assert jobs_run(out.stdout + out.stderr) == dict(
        NEW_RUN_JOBS, fetch_refiner=1, generate_cell=cells, score_cell=cells
    )
    (made,) = {p.name for p in (workdir / "results/runs").iterdir()} - before
    run_dir = workdir / "results/runs" / made
    (download,) = (workdir / "results/models/refiners").iterdir()
    fetched = json.loads((download / "fetch_refiner.manifest.json").read_text())
    assert fetched["summary"] == {"source": "tiny", "tiny_seed": 0, "vision": False} and "refiner" in fetched["outputs"]
    manifest = json.loads((run_dir / "train.manifest.json").read_text())
    assert manifest["inputs"]["refiner.writer"]["path"].endswith("/model")
    final = run_dir / "train/final"
    trained, initial = (
        load_file(final / "refiners/writer/model.safetensors"),
        load_file(download / "model/model.safetensors"),
    )
    assert any((trained[k] - initial[k]).abs().max() > 0 for k in initial)
    lines = [json.loads(line) for line in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    files = sorted((final / "rewrites").glob("batch-*.jsonl"))
    assert [m["refiner_rewrites_sha256"] for m in lines] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert all(m["refiner/writer/rewrites"] == 6 for m in lines)  # 2 prompts x 4 members, the first of each kept
    page = (run_dir / "report/report.html").read_text()
    assert "refiners.experts" in page and "What each part contributed on the evaluation set" in page
    for contribution in ("refined - trained", "refined - base_refiners", "base_refiners - trained"):
        assert page.count(f"({contribution})") == len(SAMPLERS), contribution
    assert page.count("<h3>Rewrites beside their videos") == 1
    for model in ("refined", "base_refiners"):  # each sample's rewrites beside its video, in both refiner cells
        for cell in (workdir / "results/matrix").glob(f"*/{made}-{model}/*/videos"):
            assert len(list(cell.rglob("*.json"))) == len(list(cell.rglob("*.mp4"))) > 0
