import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from videogrpo import config
from videogrpo.errors import ConfigError

RECIPES = ["rl_5b_cps", "rl_5b_sde", "rl_5b_vlm", "rl_a14b_rule"]


def load_yaml(repo, rel):
    return yaml.safe_load((repo / rel).read_text())


def test_default_config_is_valid_and_names_its_run(repo, monkeypatch):
    monkeypatch.chdir(repo)
    cfg = config.load(["config/config.yaml"])
    assert cfg.recipe == "tiny" and cfg.world_size == 2
    assert config.run_identity(cfg).startswith("tiny-")
    assert len(config.run_identity(cfg).split("-")[1]) == 12


def test_snakemake_config_strings_are_coerced():
    cfg = config.from_dict(
        {
            "recipe": "x",
            "model": {"source": "tiny"},
            "data": {"source": "synthetic"},
            "evalkit": {"path": "kit", "digest": "a" * 64},
            "train": {"lr": "1e-5", "max_steps": "7", "auto_resume": "False"},
            "grpo": {"eta_range": ["0", "1"]},
        }
    )
    assert cfg.train.lr == 1e-5 and cfg.train.max_steps == 7 and cfg.train.auto_resume is False
    assert cfg.grpo.eta_range == [0.0, 1.0]


def test_unknown_field_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"train\.learning_rate: unknown field; valid fields of train: .*lr"):
        config.from_dict({"train": {"learning_rate": 1}}, partial=True)


def test_wrong_type_names_the_field():
    with pytest.raises(ConfigError, match=r"grpo\.group_size: expected an integer, found 'many'"):
        config.from_dict({"grpo": {"group_size": "many"}}, partial=True)


@pytest.mark.parametrize(
    "section,field,value,rule",
    [
        ("model", "revision", "main", "lower-case 40-hex commit id \\(branch and tag names move"),
        ("data", "revision", "v1.0", "lower-case 40-hex commit"),
        ("model", "revision", "A" * 40, f"must be a lower-case 40-hex commit id: write '{'a' * 40}'"),
        ("evalkit", "digest", "abc", "64-hex"),
        ("grpo", "sampler", "ddim", "must be one of flowcps, dancegrpo, flowgrpo"),
        ("video", "num_frames", 80, "4k \\+ 1"),
        ("video", "height", 500, "multiple of 32"),
        ("train", "lr", 0, "must be > 0"),
    ],
)
def test_field_rules_name_field_value_and_rule(section, field, value, rule):
    data = {"model": {"revision": "a" * 40}, "evalkit": {"path": "k", "digest": "b" * 64}}
    data.setdefault(section, {})[field] = value
    with pytest.raises(ConfigError, match=rf"{section}\.{field} = .*{value}.*{rule}"):
        config.from_dict(data)


@pytest.mark.parametrize("recipe", RECIPES)
def test_released_recipes_are_valid_at_their_reference_topology(repo, monkeypatch, recipe):
    monkeypatch.chdir(repo)
    cfg = config.load(["config/config.yaml", f"config/recipes/{recipe}.yaml"])
    assert config.problems(cfg) == []
    assert config.HEX40.match(cfg.model.revision) and config.HEX40.match(cfg.data.revision)
    assert cfg.world_size == (8 if recipe == "rl_a14b_rule" else 128)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipes_set_every_field_the_default_sets(repo, recipe):
    """Snakemake layers --configfile on config/config.yaml: nothing of the tiny default may leak in."""
    base = load_yaml(repo, "config/config.yaml")
    layer = load_yaml(repo, f"config/recipes/{recipe}.yaml")
    assert config.deep_merge(base, layer) == config.deep_merge({}, layer)


def test_5b_cps_at_100_ranks_is_rejected_with_the_numbers(repo, monkeypatch):
    monkeypatch.chdir(repo)
    with pytest.raises(ConfigError) as err:
        config.load(
            ["config/config.yaml", "config/recipes/rl_5b_cps.yaml"], {"parallel": {"nodes": 25, "procs_per_node": 4}}
        )
    assert (
        "world size 100 (= nodes 25 x procs_per_node 4) must divide or be a multiple of the prompts per wave 32"
        in str(err.value)
    )


def test_group_size_must_split_over_the_ranks_of_a_prompt(repo, monkeypatch):
    monkeypatch.chdir(repo)
    with pytest.raises(
        ConfigError, match=r"grpo.group_size = 30: must be a multiple of the 4 ranks sharing each prompt"
    ):
        config.load(["config/recipes/rl_5b_cps.yaml"], {"grpo": {"group_size": 30}})


def test_vlm_recipe_runs_at_4_8_and_16_nodes(repo, monkeypatch):
    monkeypatch.chdir(repo)
    for nodes in (4, 8, 16):
        cfg = config.load(["config/recipes/rl_5b_vlm.yaml"], {"parallel": {"nodes": nodes}})
        assert cfg.world_size == nodes * 8


def test_a14b_batch_must_match_data_replicas(repo, monkeypatch):
    monkeypatch.chdir(repo)
    with pytest.raises(ConfigError, match=r"must equal train.batch_size 4 x 4 data replicas"):
        config.load(["config/recipes/rl_a14b_rule.yaml"], {"grpo": {"prompts_per_step": 32}})


@pytest.mark.parametrize(
    "grpo,message",
    [
        ({"sampler": "flowcps", "eta": 0.0}, r"grpo\.eta = 0\.0: Flow-CPS needs 0 < eta <= 1"),
        ({"sampler": "flowcps", "eta": 1.5}, r"grpo\.eta = 1\.5: Flow-CPS needs 0 < eta <= 1"),
        ({"sampler": "dancegrpo", "eta": 0.0}, r"grpo\.eta = 0\.0: DanceGRPO needs eta > 0"),
        ({"eta_range": [0.5, 0.5]}, r"grpo\.eta_range = \[0\.5, 0\.5\]: must be \[lo, hi\] with 0 <= lo < hi <= 1"),
        ({"sampler": "dancegrpo", "eta_range": [0.0, 1.0]}, r"grpo\.eta_range = .*need grpo\.sampler = 'flowcps'"),
    ],
)
def test_the_reference_sampler_rules(grpo, message):
    with pytest.raises(ConfigError, match=message):
        config.from_dict({"grpo": grpo}, partial=True)


def test_sampler_settings_the_reference_accepts():
    for grpo in (
        {"sampler": "flowcps", "eta": 1.0},
        {"sampler": "flowcps", "eta": 0.0, "eta_range": [0.0, 1.0]},
        {"sampler": "dancegrpo", "eta": 0.3},
        {"sampler": "flowgrpo", "eta": 0.0},
        {"sampler": "flowgrpo_sde", "eta": 0.7},
    ):
        config.from_dict({"grpo": grpo}, partial=True)
    assert config.from_dict({"train": {"save_steps": 0}}, partial=True).train.save_steps == 0  # no periodic save


def test_held_out_evaluation_needs_held_out_samples():
    with pytest.raises(ConfigError, match=r"matrix\.split = 'heldout': data\.heldout_per_task is 0"):
        config.from_dict({"data": {"heldout_per_task": 0}, "matrix": {"split": "heldout"}}, partial=True)
    config.from_dict({"data": {"heldout_per_task": 0}, "matrix": {"split": "rl"}}, partial=True)
    tree = {"eval_set": "/data/VBVR-Pro-Eval", "eval_set_digest": "ab" * 32}  # the split of no built set
    config.from_dict({"data": {"heldout_per_task": 0}, "matrix": {"split": "heldout", **tree}}, partial=True)


def test_an_evaluation_tree_that_is_not_there_is_named_before_its_pin(tmp_path):
    """The path first: a pin for a tree that does not exist cannot be followed; a tree that is there gets the
    digest to pin in the refusal, since no stage can run to print it before one is pinned."""
    from videogrpo.provenance.digest import tree_digest

    missing = tmp_path / "no-such-tree"
    with pytest.raises(ConfigError) as err:
        config.from_dict({"matrix": {"eval_set": str(missing)}}, partial=True)
    message = str(err.value)
    assert f"matrix.eval_set = {str(missing)!r}: no such directory; point matrix.eval_set at the release" in message
    assert "eval_set_digest = ''" not in message
    tree = tmp_path / "tree"
    (tree / "In-Domain_50").mkdir(parents=True)
    (tree / "split_manifest.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        config.from_dict({"matrix": {"eval_set": str(tree)}}, partial=True)
    said = str(err.value)
    (command,) = re.findall(r"print its digest with (python -c \".*?\"), then set matrix.eval_set_digest", said)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # the env active
    printed = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=True).stdout
    assert printed.strip() == tree_digest(tree)  # the command the message gives prints the digest to pin


@pytest.mark.parametrize(
    ("given", "home"),
    [
        ({"split": "rl"}, "set matrix.split"),
        ({"max_samples_per_task": 4}, "set matrix.samples_per_task"),
        ({"compare_base": False}, "set matrix.compare_base"),
        ({"seed": 1234}, "set matrix.seed"),
        ({"sampling_steps": 8}, "set grpo.sampling_steps"),
        ({"sampler": "flowcps"}, "training sampler (grpo.sampler)"),
        ({"eta": 0.0}, "grpo.eta or grpo.eta_range"),
    ],
)
def test_a_field_of_the_evaluate_section_is_refused_naming_its_new_home(repo, given, home):
    """The held-out check is the matrix's cells now: a config that still gives evaluate.<field> (a recipe of an
    older checkout) stops with the field and where its setting lives, never read as something else."""
    (field,) = given
    layers = config.deep_merge(load_yaml(repo, "config/config.yaml"), {"evaluate": given})
    with pytest.raises(ConfigError) as err:
        config.from_dict(layers)
    message = str(err.value)
    assert f"evaluate.{field}: the `evaluate` section is gone: the held-out check is the matrix's cells" in message
    assert home in message
    with pytest.raises(ConfigError, match=r"evaluate: the `evaluate` section is gone.*delete the section"):
        config.from_dict({"evaluate": {}}, partial=True)
    with pytest.raises(ConfigError, match=r"matrix\.synthetic_per_task: gone with the synthetic evaluation tree"):
        config.from_dict({"matrix": {"synthetic_per_task": 2}}, partial=True)


@pytest.mark.parametrize("recipe", ["rl_5b_cps", "rl_5b_sde", "rl_5b_vlm"])
def test_the_5b_recipes_train_on_all_50000_samples_in_7728_updates(repo, monkeypatch, tmp_path, recipe):
    """The whole dataset trains (the reference's 1,562 batches per epoch), not 49,800 with 4 per task held out."""
    from videogrpo.data.dataset import load_split, steps_per_epoch, training_order
    from videogrpo.data.materialize import split
    from videogrpo.data.video import playback_fps
    from videogrpo.grpo.replay import total_updates
    from videogrpo.grpo.trainer import run_plan

    monkeypatch.chdir(repo)
    cfg = config.load(["config/config.yaml", f"config/recipes/{recipe}.yaml"])
    tasks = config.read_task_list(cfg.data.task_list)
    index = {task: [f"{task}_{i:05d}" for i in range(cfg.data.samples_per_task)] for task in tasks}
    manifest = [
        {"task": task, "source": task, "split": cfg.data.split_name, **ids}
        for task, ids in split(index, cfg.data.heldout_per_task, cfg.data.shuffle_seed).items()
    ]
    (tmp_path / "dataset.json").write_text(json.dumps({"root": "raw"}))
    (tmp_path / "splits.json").write_text(json.dumps(manifest))
    train = load_split(tmp_path, "rl")
    assert len(train) == 50_000 and not load_split(tmp_path, "heldout")
    assert steps_per_epoch(len(train), cfg.grpo.prompts_per_step) == 1562
    assert total_updates(run_plan(cfg, len(train))) == 7728
    order = training_order(train, cfg.data.shuffle_seed)  # numpy default_rng(42) over the task-grouped index
    assert order[0] == train[int(np.random.default_rng(42).permutation(50_000)[0])]
    assert cfg.matrix.split == "rl" and cfg.matrix.samples_per_task == 4 and cfg.matrix.compare_base
    assert playback_fps(cfg.video.num_frames, cfg.video.fps, cfg.evalkit.max_seconds) == 16  # 81 frames, 5.0625 s


def test_every_field_has_exactly_one_class_and_the_identity_digests_the_contract():
    classes = {path: config.field_class(path) for path in config.field_paths()}  # raises on an unclassified one
    assert set(classes.values()) == {config.CONTRACT, config.EXECUTION, config.EVALUATION, config.COSMETIC}
    contract = config.training_contract(config.Config(), "T-1\n")
    digested = {f"{section}.{name}" for section, fields in contract.items() for name in fields}
    off = {path for switches, dependents in config.identity.OPTION_GROUPS for path in (*switches, *dependents)}
    assert digested == {p for p, c in classes.items() if c == config.CONTRACT} - {"recipe"} - off
    # Every option is a contract field, and its switches are off by default.
    assert off <= {p for p, c in classes.items() if c == config.CONTRACT}
    for switches, _ in config.identity.OPTION_GROUPS:
        for path, value in switches.items():
            section, name = path.split(".")
            assert getattr(getattr(config.Config(), section), name) == value, path


@pytest.mark.parametrize(
    "change",
    [
        {"grpo": {"clip_range_high": 0.02}},
        {"grpo": {"skip_zero_variance_groups": True}},
        {"grpo": {"vae_tile_size": 64}},
        {"grpo": {"sde_window_size": 2}},
        {"grpo": {"sde_window_tail": "dpm_solver", "sde_window_size": 2}},
        {"grpo": {"grpo_guard": True, "sampler": "dancegrpo", "eta": 0.3}},
        {"grpo": {"algorithm": "nft", "sampler": "euler", "share_group_noise": False, "delayed_replay": False}},
        {"reward": {"terms": {"vbvr_rule": 1.0}}},
        {"train": {"lora_rank": 4}},
        {"train": {"validate_every": 2}},
        {"train": {"validate_before_training": True}},
        {"train": {"validate_rewards": ["vbvr_vlm"], "validate_before_training": True}},
        {"train": {"keep_best_by": "vbvr_vlm", "validate_rewards": ["vbvr_vlm"], "validate_before_training": True}},
        {"train": {"stop_on_divergence": True, "validate_rewards": ["vbvr_vlm"], "validate_before_training": True}},
    ],
    ids=lambda change: ".".join(next(iter(change.items()))[1]),
)
def test_an_option_turned_on_is_a_new_run_and_its_fields_count_only_then(repo, monkeypatch, change):
    """Off, an option's fields (switches and the fields that only matter when it is on) are left out of the run
    identity and of train's params; on, they are in both, its dependent fields included."""
    monkeypatch.chdir(repo)
    held = {"data": {"heldout_per_task": 1}}  # validation reads held-out prompts

    def load(*changes):
        merged = {}
        for layer in (held, *changes):
            merged = config.deep_merge(merged, layer)
        return config.load([repo / "config/config.yaml"], merged)

    off, on = load(), load(change)
    assert config.run_identity(on) != config.run_identity(off)
    params_off = config.identity_fields(config.stage_view(off, "train"))
    params_on = config.identity_fields(config.stage_view(on, "train"))
    ((section, values),) = change.items()
    switch = f"{section}.{next(iter(values))}"
    assert switch not in params_off and switch in params_on
    moved = {
        "lora_alpha": 8.0,
        "lora_dropout": 0.1,
        "lora_targets": ["to_q"],
        "lora_export_merged": True,
        "lora_base_dtype": "float32",
        "sde_window_range": [0, 4],
        "sde_window_mode": "sliding",
        "sde_window_stride": 2,
        "sde_window_shift_every": 5,
        "sde_window_tail_ratio": 0.2,
        "validate_rewards_fail_on_error": True,
        "divergence_points": 3,
        "divergence_sigmas": 2.0,
        "divergence_min_change": 0.05,
        "validate_prompts": 2,
        "validate_sampler": "unipc",
        "grpo_guard_scope": "row",
        "nft_beta": 0.5,
        "nft_adv_clip": 2.0,
        "nft_old_decay_rate": 0.01,
        "nft_old_decay_max": 0.3,
        "nft_old_decay_after": 3,
    }
    for switches, dependents in config.identity.OPTION_GROUPS:
        if switch not in switches:
            continue
        for path in dependents:
            assert path not in params_off and path in params_on
            # A dependent field changed while its option is off is no new run; while it is on, it is one.
            section_name, name = path.split(".")
            assert moved[name] != getattr(getattr(off, section_name), name)
            dependent = {section_name: {name: moved[name]}}
            assert config.run_identity(load(dependent)) == config.run_identity(off)
            assert config.run_identity(load(change, dependent)) != config.run_identity(on)


IDENTITY_CASES = {
    config.CONTRACT: [
        ("train", "lr", 2e-4),
        ("grpo", "sampler", "dancegrpo"),
        ("model", "tiny_seed", 1),
        ("data", "synthetic_seed", 3),
        ("evalkit", "digest", "c" * 64),
        ("reward", "judge_frames", 8),
        ("parallel", "param_dtype", "bfloat16"),
        ("train", "save_steps", 3),
    ],
    config.EXECUTION: [
        ("parallel", "master_port", 29600),
        ("parallel", "cpu_threads", 2),
        ("parallel", "attention_backend", "_native_math"),
        ("evalkit", "workers", 2),
        ("evalkit", "path", "elsewhere"),
        ("train", "keep_checkpoints", 5),
        ("train", "resume_from", "/ckpt/step-00000100"),
        ("train", "gradient_checkpointing", True),
        ("train", "resume_across_code_changes", True),
        ("logging", "wandb_mode", "disabled"),
        ("train", "retries", 3),
        ("kubernetes", "volume_claim", "videogrpo-shared"),
        ("reward", "judge_port", 1),
    ],
    config.EVALUATION: [
        ("matrix", "seed", 7),
        ("matrix", "split", "rl"),
        ("matrix", "samples_per_task", 1),
        ("matrix", "compare_base", False),
        ("matrix", "num_frames", 33),
    ],
    config.COSMETIC: [("data", "split_name", "renamed"), ("logging", "wandb_project", "elsewhere")],
}


@pytest.mark.parametrize("kind", list(IDENTITY_CASES))
def test_only_contract_fields_change_the_run_identity(repo, monkeypatch, kind):
    monkeypatch.chdir(repo)
    base = load_yaml(repo, "config/config.yaml")
    tasks = (repo / "config/tasks/synthetic.txt").read_text()
    ident = config.run_identity(config.from_dict(base), tasks)
    for section, field, value in IDENTITY_CASES[kind]:
        assert config.field_class(f"{section}.{field}") == kind, (section, field)
        data = copy.deepcopy(base)
        data.setdefault(section, {})[field] = value
        changed = config.run_identity(config.from_dict(data), tasks)
        assert (changed != ident) == (kind == config.CONTRACT), (section, field)
    data = copy.deepcopy(base)
    data["parallel"]["procs_per_node"], data["grpo"]["prompts_per_step"] = 1, 1  # topology is contract
    assert config.run_identity(config.from_dict(data), tasks) != ident
    assert config.run_identity(config.from_dict(base), tasks + "S-9_extra\n") != ident


def test_download_params_are_what_they_download(repo, monkeypatch):
    """Other fields of the model and data sections never download again (nor rename the download directory)."""
    from videogrpo.pipeline import layout

    monkeypatch.chdir(repo)
    tasks = (repo / "config/tasks/synthetic.txt").read_text()
    for source in ("tiny-synthetic", "hub"):
        base = load_yaml(repo, "config/config.yaml")
        if source == "hub":
            base = config.deep_merge(base, load_yaml(repo, "config/recipes/rl_5b_cps.yaml"))
        cfg = config.from_dict(base)
        views = {stage: config.stage_view(cfg, stage) for stage in ("fetch_model", "fetch_dataset")}
        keys = (layout.model_key(cfg), layout.data_key(cfg, tasks))
        other = config.from_dict(
            config.deep_merge(
                base,
                {
                    "model": {"max_text_tokens": 16},
                    "data": {"heldout_per_task": 1, "split_name": "x", "shuffle_seed": 7},
                },
            )
        )
        assert {stage: config.stage_view(other, stage) for stage in views} == views, source
        assert (layout.model_key(other), layout.data_key(other, tasks)) == keys, source
    assert set(views["fetch_dataset"]["data"]) == {"source", "repo_id", "revision", "archive_glob"}
    assert set(views["fetch_model"]["model"]) == {"source", "repo_id", "revision"}


def test_schema_file_is_generated_from_the_dataclasses(repo):
    on_disk = json.loads((repo / "workflow/schemas/config.schema.json").read_text())
    assert on_disk == json.loads(json.dumps(config.json_schema())), (
        "run: videogrpo schema > workflow/schemas/config.schema.json"
    )


def test_schema_accepts_the_resolved_default_and_rejects_unknown_fields(repo):
    import jsonschema

    schema = config.json_schema()
    resolved = config.to_dict(config.from_dict(load_yaml(repo, "config/config.yaml")))
    jsonschema.validate(resolved, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(resolved, train=dict(resolved["train"], learning_rate=1)), schema)


def test_every_field_has_a_docstring():
    import dataclasses
    import typing

    from videogrpo.config.types import field_docs

    sections = [config.Config] + [
        tp for tp in typing.get_type_hints(config.Config).values() if dataclasses.is_dataclass(tp)
    ]
    for section in sections:
        hints = typing.get_type_hints(section)
        missing = [
            f.name
            for f in dataclasses.fields(section)
            if f.name not in field_docs(section) and not dataclasses.is_dataclass(hints[f.name])
        ]
        assert not missing, f"{section.__name__}: {missing}"


def test_stage_views_hold_only_their_sections(repo, monkeypatch):
    monkeypatch.chdir(repo)
    cfg = config.load(["config/config.yaml"])
    assert set(config.stage_view(cfg, "fetch_model")) == {"model"}
    assert "matrix" not in config.stage_view(cfg, "train")
    partial = config.from_dict(config.stage_view(cfg, "fetch_model"), partial=True)
    assert (partial.model.source, partial.model.tiny_seed) == (cfg.model.source, cfg.model.tiny_seed)


def test_a_field_the_chosen_source_does_not_read_makes_no_new_run_and_no_param(repo, monkeypatch):
    """model.revision means nothing to the tiny generator, nor the Hub repository to synthetic data: read as
    empty, they change neither the run identity nor any stage's view; under `hub` they are the pin."""
    monkeypatch.chdir(repo)
    base = load_yaml(repo, "config/config.yaml")
    tasks = (repo / "config/tasks/synthetic.txt").read_text()
    cfg = config.from_dict(base)
    hex40 = "0123456789abcdef0123456789abcdef01234567"
    inert = config.from_dict(
        config.deep_merge(base, {"model": {"revision": hex40, "repo_id": "a/b"}, "data": {"revision": hex40}})
    )
    assert config.run_identity(inert, tasks) == config.run_identity(cfg, tasks)
    for stage in ("preflight", "train", "eval_set", "fetch_model", "fetch_dataset", "generate_cell"):
        assert config.stage_view(inert, stage) == config.stage_view(cfg, stage), stage
    hub = config.deep_merge(base, {"model": {"source": "hub", "repo_id": "a/b", "revision": hex40}})
    other = config.deep_merge(hub, {"model": {"revision": hex40[::-1]}})
    assert config.run_identity(config.from_dict(hub), tasks) != config.run_identity(config.from_dict(other), tasks)
    seeded = config.deep_merge(hub, {"model": {"tiny_seed": 7}})  # the tiny generator's seed, under hub
    assert config.run_identity(config.from_dict(hub), tasks) == config.run_identity(config.from_dict(seeded), tasks)


def test_stage_params_are_the_contract_and_evaluation_fields_only(repo, monkeypatch):
    monkeypatch.chdir(repo)
    cfg = config.from_dict(load_yaml(repo, "config/config.yaml"))
    for stage in config.STAGE_SECTIONS:
        view = config.stage_view(cfg, stage)
        params = config.identity_fields(view)
        kinds = {config.field_class(path) for path in params}
        assert kinds <= {config.CONTRACT, config.EVALUATION}, (stage, kinds)
    train = config.identity_fields(config.stage_view(cfg, "train"))
    assert "train.lr" in train and "evalkit.workers" not in train and "parallel.master_port" not in train
    assert "logging.wandb_project" not in train and "train.keep_checkpoints" not in train


# The run identities of the released recipes and of the tiny default, pinned: a refactoring that moves code or
# renames a module must not turn a user's run into a new one (its checkpoints would no longer resume).
PINNED_RUN_IDENTITIES = {
    # Moved from tiny-7eb8e331ee87 with evalkit.digest: the stand-in EvalKit now imports at module level what the
    # public EvalKit imports there (numpy and tqdm, cv2, PIL), a new source digest and so a new run.
    (): "tiny-abe38afd3285",
    ("config/recipes/rl_5b_cps.yaml",): "rl_5b_cps-d2a1b25d7a25",
    ("config/recipes/rl_5b_sde.yaml",): "rl_5b_sde-07df3930adf5",
    ("config/recipes/rl_5b_vlm.yaml",): "rl_5b_vlm-061d22cecaf7",
    ("config/recipes/rl_a14b_rule.yaml",): "rl_a14b_rule-a5cdf36e9356",
}


@pytest.mark.parametrize("layers", list(PINNED_RUN_IDENTITIES), ids=lambda layers: layers[0] if layers else "tiny")
def test_the_run_identities_of_the_recipes_and_the_tiny_default_are_pinned(repo, layers):
    cfg = config.load([repo / "config/config.yaml", *(repo / layer for layer in layers)], {})
    assert config.run_identity(cfg) == PINNED_RUN_IDENTITIES[layers]


def test_the_evaluation_set_is_keyed_and_read_by_its_source_only(repo, monkeypatch):
    """Built from the dataset: eval_set reads the split and the count, its directory digests them and the data that
    fixes the splits, and a field of an external tree changes neither; given a tree, the other way round."""
    from videogrpo.pipeline import layout

    monkeypatch.chdir(repo)
    base = load_yaml(repo, "config/config.yaml")
    tasks = (repo / "config/tasks/synthetic.txt").read_text()

    def view_and_key(**changes) -> tuple[dict, str]:
        cfg = config.from_dict(config.deep_merge(base, changes))
        return config.stage_view(cfg, "eval_set"), layout.evalset_key(cfg, tasks)

    built, key = view_and_key()
    assert built == {"matrix": {"eval_set": "", "split": "heldout", "samples_per_task": None}}
    assert key.startswith("heldout-")
    assert view_and_key(matrix={"expected_samples": 7}) == (built, key)  # an external tree's count
    assert view_and_key(data={"verify_existing": True}) == (built, key)  # an execution field
    for changes in (
        {"matrix": {"samples_per_task": 1}},
        {"data": {"heldout_per_task": 1}},
        {"data": {"shuffle_seed": 1}},
    ):
        assert view_and_key(**changes)[1] != key, changes
    tree = {"eval_set": "/data/VBVR-Pro-Eval", "eval_set_digest": "ab" * 32}
    external, tree_key = view_and_key(matrix=tree)
    assert set(external["matrix"]) == {"eval_set", "eval_set_digest", "expected_samples"}
    assert tree_key == f"evalset-{'ab' * 6}"
    assert view_and_key(matrix={**tree, "split": "rl", "samples_per_task": 2}) == (external, tree_key)
