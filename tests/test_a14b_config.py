"""The A14B configuration up to the trainer: `train.experts`, `config/tiny_a14b.yaml`, fetch_model's tiny two-expert
pipeline, what preflight and the memory plan read of a two-expert directory, and `rl_a14b_rule` as released
(diffusers' SDPA, so no fetch_kernel job). Nothing here trains: the trainer refuses model.kind i2v_a14b until it
is wired."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from demo import RULES, jobs_run

from videogrpo import cli, config
from videogrpo.errors import ConfigError
from videogrpo.models.shapes import WAN_I2V_A14B_EXPERT
from videogrpo.parallel import shard_layout
from videogrpo.pipeline import layout
from videogrpo.preflight import checks as preflight
from videogrpo.preflight import memory_plan, model_shape
from videogrpo.preflight.model_shape import ModelShape, ParamCounts
from videogrpo.provenance.digest import tree_digest

from conftest import REPO

BOTH = ("transformer", "transformer_2")


def tiny_a14b(**sections) -> config.Config:
    """config/config.yaml with config/tiny_a14b.yaml on it, as `snakemake --configfile config/tiny_a14b.yaml`."""
    layers = [yaml.safe_load((REPO / name).read_text()) for name in ("config/config.yaml", "config/tiny_a14b.yaml")]
    return config.from_dict(config.deep_merge(config.deep_merge(*layers), sections))


def fetch(out: Path, kind: str, seed: int = 0) -> tuple[Path, Path]:
    """`videogrpo fetch-model` with the tiny source, as the workflow runs it (its stage view of the config)."""
    model = config.from_dict({"model": {"source": "tiny", "kind": kind, "tiny_seed": seed}}, partial=True)
    view = config.stage_view(model, "fetch_model")
    manifest = out.parent / "fetch_model.manifest.json"
    argv = ["stage", "fetch-model", "--config-json", json.dumps(view), "--out", str(out), "--manifest", str(manifest)]
    assert cli.main(argv) == 0
    return out, manifest


@pytest.fixture(scope="module")
def fetched(tmp_path_factory) -> tuple[Path, Path]:
    return fetch(tmp_path_factory.mktemp("a14b") / "pipeline", "i2v_a14b")


def expert_parameters(model_dir: Path, folder: str) -> int:
    from diffusers import WanTransformer3DModel

    return sum(p.numel() for p in WanTransformer3DModel.from_pretrained(model_dir / folder).parameters())


def test_train_experts_is_a_contract_choice_and_ti2v_takes_only_both():
    assert config.Config().train.experts == "both"
    assert config.field_class("train.experts") == config.CONTRACT
    assert config.json_schema()["properties"]["train"]["properties"]["experts"]["enum"] == ["both", "high", "low"]
    for experts in ("both", "high", "low"):
        assert config.problems(tiny_a14b(train={"experts": experts})) == [], experts
    with pytest.raises(ConfigError) as err:
        config.from_dict({"model": {"kind": "ti2v"}, "train": {"experts": "high"}}, partial=True)
    assert "train.experts = 'high': model.kind = 'ti2v' has one transformer" in str(err.value)
    assert "set train.experts: both" in str(err.value)
    with pytest.raises(ConfigError, match=r"train\.experts = 'middle': must be one of both, high, low"):
        config.from_dict({"train": {"experts": "middle"}}, partial=True)
    # The experts trained are what the run computes: another choice is another run.
    tasks = (REPO / "config/tasks/synthetic.txt").read_text()
    identities = {config.run_identity(tiny_a14b(train={"experts": e}), tasks) for e in ("both", "high", "low")}
    assert len(identities) == 3 and all(i.startswith("tiny_a14b-") for i in identities)


def test_tiny_a14b_is_the_recipes_path_at_tiny_scale_on_4_cpu_processes():
    cfg = tiny_a14b()
    assert config.problems(cfg) == []
    assert (cfg.recipe, cfg.model.source, cfg.model.kind, cfg.train.experts) == (
        "tiny_a14b",
        "tiny",
        "i2v_a14b",
        "both",
    )
    p, g = cfg.parallel, cfg.grpo
    assert (p.nodes, p.procs_per_node, p.tensor_parallel, p.data_parallel) == (1, 4, 2, "fsdp")
    assert (p.device, p.backend, p.attention_backend) == ("cpu", "gloo", "native")
    assert not g.shared_prompts and not g.delayed_replay
    assert (g.sampler, g.eta_range, g.sample_batch_size, g.sampling_steps) == ("flowcps", [0.0, 1.0], 1, 8)
    replicas = cfg.world_size // p.tensor_parallel
    assert replicas == 2 and g.prompts_per_step == cfg.train.batch_size * replicas
    assert cfg.train.max_steps <= 4 and cfg.matrix.models == ["base", "trained"] and len(cfg.matrix.samplers) == 1
    with pytest.raises(ConfigError, match=r"must equal train\.batch_size 2 x 2 data replicas"):
        tiny_a14b(train={"batch_size": 2})


def test_fetch_model_builds_the_two_expert_pipeline_model_kind_names(fetched, tmp_path):
    model_dir, manifest = fetched
    index = json.loads((model_dir / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline" and index["boundary_ratio"] == 0.875
    assert index["transformer"][1] == index["transformer_2"][1] == "WanTransformer3DModel"
    for folder in BOTH:
        assert json.loads((model_dir / folder / "config.json").read_text())["in_channels"] == 36
    record = json.loads(manifest.read_text())
    assert record["summary"] == {"source": "tiny", "kind": "i2v_a14b", "seed": 0}
    assert record["outputs"]["model"]["tree_sha256"] == tree_digest(model_dir)
    # models/tiny_i2v.py's pipeline, seeded by model.tiny_seed: the same seed the same bytes, another seed others.
    from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline

    save_tiny_i2v_pipeline(tmp_path / "again", 0)
    assert tree_digest(tmp_path / "again") == tree_digest(model_dir)
    other, _ = fetch(tmp_path / "seed1" / "pipeline", "i2v_a14b", seed=1)
    assert tree_digest(other) != tree_digest(model_dir)
    ti2v, ti2v_manifest = fetch(tmp_path / "ti2v" / "pipeline", "ti2v")
    assert not (ti2v / "transformer_2").exists() and json.loads(ti2v_manifest.read_text())["summary"]["kind"] == "ti2v"


def test_the_tiny_builders_kind_is_a_download_param_and_keys_the_model_directory():
    ti2v, i2v = tiny_a14b(model={"kind": "ti2v"}, train={"experts": "both"}), tiny_a14b()
    assert config.stage_view(i2v, "fetch_model") == {"model": {"source": "tiny", "kind": "i2v_a14b", "tiny_seed": 0}}
    assert layout.model_key(ti2v) != layout.model_key(i2v)
    # Other model fields still never rebuild it.
    assert layout.model_key(tiny_a14b(model={"max_text_tokens": 16})) == layout.model_key(i2v)


def test_both_experts_serve_steps_of_the_tiny_a14b_schedule(fetched):
    """What the comment in config/tiny_a14b.yaml says: the model's flow shift 5, its boundary 875, 8 steps 4 / 4."""
    from videogrpo.grpo.samplers import sigma_schedule
    from videogrpo.models.i2v import EXPERTS, WanI2VA14B, boundary_of, expert_schedule
    from videogrpo.models.wan import flow_shift

    model_dir, _ = fetched
    cfg = tiny_a14b()
    shift, source = flow_shift(cfg, model_dir)
    assert shift == 5.0 and "scheduler_config.json" in source
    assert boundary_of(model_dir) == (0.875, 875)
    steps = expert_schedule(sigma_schedule(cfg.grpo.sampling_steps, shift), 875, EXPERTS)
    assert steps == ["high"] * 4 + ["low"] * 4
    # The video geometry is one the tiny I2V model accepts (time / 4, space / 8, patch 2).
    model = WanI2VA14B.from_config(model_dir, torch.device("cpu"), cfg, experts=cfg.train.experts)
    geometry = model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width)
    assert (geometry.frames, geometry.height, geometry.width) == (5, 8, 8)


def test_preflight_checks_the_experts_the_run_trains(fetched, tmp_path):
    model_dir, manifest = fetched
    for experts, folders in (("both", BOTH), ("high", ("transformer",)), ("low", ("transformer_2",))):
        assert preflight.trained_transformers(tiny_a14b(train={"experts": experts})) == folders
    assert preflight.trained_transformers(config.Config()) == ("transformer",)
    check = preflight.check_model_dir(model_dir, manifest, BOTH)
    assert check.ok, check.detail
    # A pipeline without the low-noise expert: its folder gone, or model_index.json not naming it.
    gone = tmp_path / "gone"
    shutil.copytree(model_dir, gone)
    shutil.rmtree(gone / "transformer_2")
    check = preflight.check_model_dir(gone, manifest, BOTH)
    assert not check.ok and "missing ['transformer_2/config.json']" in check.detail
    unnamed = tmp_path / "unnamed"
    shutil.copytree(model_dir, unnamed)
    index = json.loads((unnamed / "model_index.json").read_text())
    (unnamed / "model_index.json").write_text(json.dumps(dict(index, transformer_2=[None, None])))
    check = preflight.check_model_dir(unnamed, manifest, BOTH)
    assert not check.ok and "names no transformer_2" in check.detail and "train.experts: high" in check.detail
    # The parameter count of the checkpoints preflight makes room for: every trained expert's.
    high, low = (expert_parameters(model_dir, folder) for folder in BOTH)
    assert preflight.transformer_parameters(model_dir, BOTH) == high + low
    assert preflight.transformer_parameters(model_dir, ("transformer",)) == high
    disk = preflight.check_disk_space(tiny_a14b(), model_dir, tmp_path / "run")
    assert disk.ok and f"checkpoints of {high + low:,} parameters" in disk.detail


def first_chunks(shapes: dict, tp: int, fsdp: int) -> int:
    """Elements of rank 0's shards: TP splits the parameters of shard_layout's table (which tensor_parallel.block_plan
    is built from) in tp, then FSDP2 cuts dim 0 of each piece as torch.chunk does, rank 0 holding the first chunk."""
    total = 0
    for name, full in shapes.items():
        local = list(full)
        if (dim := shard_layout.tp_split_dim(name)) is not None:
            local[dim] //= tp
        total += torch.chunk(torch.empty(local, device="meta"), fsdp)[0].numel()
    return total


def test_the_memory_plan_holds_the_state_of_every_trained_expert(fetched):
    """The optimizer state of both experts, sharded TP 2 x FSDP 2 over 4 ranks; one expert's working sets."""
    model_dir, _ = fetched
    high = expert_parameters(model_dir, "transformer")
    assert expert_parameters(model_dir, "transformer_2") == high  # the same layout, other weights
    both, one = ModelShape.from_model_dir(model_dir, BOTH), ModelShape.from_model_dir(model_dir, ("transformer",))
    assert both.trained == 2 * high and one.trained == high and both.params == one.params
    assert both.params.total == high and both.z_dim == 16 and (both.spatial, both.temporal) == (8, 4)
    for experts, trained in (("both", 2 * high), ("high", high), ("low", high)):
        cfg = tiny_a14b(train={"experts": experts})
        check, report = preflight.check_memory_plan(cfg, model_dir)
        assert check.ok and "not enforced on CPU" in check.detail
        assert report["sharding"] == 4  # FSDP over the 2 data replicas x tensor_parallel 2
        terms = {t["name"]: t["bytes"] for t in report["terms"]}
        # TP 2, then FSDP2 chunks each rank's piece in 2 (torch.chunk); what TP leaves whole is split in 2 only.
        per_rank = first_chunks(both.params.shapes, tp=2, fsdp=2) * trained // high
        assert terms["master weights"] == 4 * per_rank and terms["AdamW moments"] == 8 * per_rank
        assert terms["gradients"] == 4 * per_rank and per_rank > trained // 4
        # One expert runs at a time: FSDP's unsharded root and blocks are one expert's, whichever are trained; TP 2
        # has split the blocks before FSDP gathers them.
        p = both.params
        assert terms["FSDP unsharded"] == 4 * (p.outside_blocks + 2 * (p.per_block // 2))
    assert "(2 experts)" in "\n".join(memory_plan.plan_for_config(tiny_a14b(), both).lines())


def test_the_a14b_recipe_plans_both_experts_at_tp2_x_fsdp4():
    counts = ParamCounts.from_shapes(model_shape.config_shapes(WAN_I2V_A14B_EXPERT))
    assert 14.0e9 < counts.total < 14.5e9  # "A14B": 14 B per expert, 27 B in all
    shape = ModelShape(dict(WAN_I2V_A14B_EXPERT), counts, 0, 16, 8, 4, (counts, counts))
    data = yaml.safe_load((REPO / "config/recipes/rl_a14b_rule.yaml").read_text())
    data["parallel"]["device_memory_gib"] = 141
    plan = memory_plan.plan_for_config(config.from_dict(data, partial=True), shape)
    terms = {t.name: t.bytes for t in plan.terms}
    # 161 x 256 x 256: 41 x 32 x 32 latents, 10,496 tokens (docs/reference-system.md#a14b); 4 prompts x 1 member a
    # forward.
    assert plan.facts["video_tokens"] == 10496 and plan.facts["latent_shape"] == [16, 41, 32, 32]
    assert plan.facts["sharding"] == 8  # FSDP over 4 replicas x TP 2: not the world size 8 x 2
    # TP splits the blocks' projections in 2 (shard_layout's table, which tensor_parallel.block_plan is built from),
    # then FSDP2 chunks dim 0 of each rank's piece in 4 as torch.chunk does; what TP leaves whole (embedders, norms,
    # modulation tables, the output head, row-wise biases) is split in 4 only. `videogrpo simulate` checks the
    # same numbers against torch's own sharding.
    first_chunk = first_chunks(counts.shapes, tp=2, fsdp=4)
    assert first_chunk * 8 > counts.total
    assert terms["master weights"] == 4 * 2 * first_chunk  # both experts
    assert terms["AdamW moments"] == 8 * 2 * first_chunk  # rank 0 holds the full first chunks
    print("\n".join(plan.lines()))


def dry_run(*args: str, **env: str) -> str:
    out = subprocess.run(
        ["snakemake", "-n", "--cores", "1", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def test_the_tiny_a14b_dry_run_lists_every_stage(tmp_path):
    jobs = jobs_run(dry_run("--configfile", "config/tiny_a14b.yaml", "--config", f"results={tmp_path}"))
    assert set(jobs) == set(RULES) | {"all"}  # native attention: no fetch_kernel
    # Base and trained by one sampler, and by the training's eta range: the held-out check.
    assert jobs["generate_cell"] == jobs["score_cell"] == 4


def test_the_a14b_recipe_as_released_uses_sdpa_and_its_dry_run_needs_no_network(tmp_path):
    data = yaml.safe_load((REPO / "config/recipes/rl_a14b_rule.yaml").read_text())
    # diffusers' default: SDPA (docs/reference-system.md#recipes)
    assert data["parallel"]["attention_backend"] == "native"
    assert (data["evalkit"]["max_seconds"], data["evalkit"]["fail_on_error"]) == (5.0, True)
    assert not config.uses_hub_kernel(config.from_dict(data, partial=True))
    # A closed port as the Hub, and offline mode: a dry run that reached the network would fail.
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    text = dry_run("--configfile", "config/recipes/rl_a14b_rule.yaml", "--config", f"results={tmp_path}", **offline)
    assert set(jobs_run(text)) == set(RULES) | {"all"}  # the matrix: the held-out check's two cells
    assert f"{tmp_path}/runs/rl_a14b_rule-" in text and "fetch_kernel" not in text


def test_the_config_command_layers_repeated_configfile_flags(capsys, monkeypatch):
    def shown(*argv: str) -> str:
        assert cli.main(["config", *argv]) == 0
        return capsys.readouterr().out

    monkeypatch.chdir(REPO)
    repeated = shown("--configfile", "config/config.yaml", "--configfile", "config/tiny_a14b.yaml")
    assert repeated == shown("--configfile", "config/config.yaml", "config/tiny_a14b.yaml")
    assert repeated.startswith("# run identity: tiny_a14b-") and "(world size 4)" in repeated.splitlines()[0]
    assert shown().startswith("# run identity: tiny-")  # no flag: config/config.yaml
