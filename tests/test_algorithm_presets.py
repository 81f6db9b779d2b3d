"""The published algorithms as their authors run them (config/algorithms/*.yaml; docs/options.md#algorithm-presets)
and the settings that leave an algorithm a shadow of itself (config/option_rules.py setting_warnings).

Each preset is a config layer after a recipe: it loads after the tiny default and after every 5B recipe with no
warning, names its source (repository and commit), and a dry run of a recipe with a preset plans the run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from demo import jobs_run, run

from videogrpo import config
from videogrpo.errors import ConfigError

from conftest import REPO

PRESETS = sorted(p.stem for p in (REPO / "config/algorithms").glob("*.yaml"))
BASE = {"mixgrpo_flash": ["config/algorithms/mixgrpo.yaml"]}  # Flash is layered after MixGRPO
RECIPES = ["config/recipes/rl_5b_cps.yaml", "config/recipes/rl_5b_sde.yaml", "config/recipes/rl_5b_vlm.yaml"]


def layers(preset: str, recipe: str | None = None) -> list[str]:
    return [
        "config/config.yaml",
        *([recipe] if recipe else []),
        *BASE.get(preset, []),
        f"config/algorithms/{preset}.yaml",
    ]


def test_the_presets_are_the_four_algorithms_and_flash():
    assert PRESETS == ["diffusion_nft", "flow_grpo_fast", "grpo_guard", "mixgrpo", "mixgrpo_flash"]


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_names_its_source_and_loads_after_every_5b_recipe_and_the_tiny_default(preset, monkeypatch):
    monkeypatch.chdir(REPO)
    text = (REPO / f"config/algorithms/{preset}.yaml").read_text()
    assert re.search(r"^# Source: [\w-]+/[\w-]+ at [0-9a-f]{7}", text, re.M), "the preset names no source commit"
    for recipe in [None, *RECIPES]:
        cfg = config.load(layers(preset, recipe))
        assert config.setting_warnings(cfg) == [], (preset, recipe)
        assert config.options_on(config.flat_fields(config.to_dict(cfg))), (preset, recipe)  # a run of its own


def test_the_a14b_recipe_refuses_the_lora_presets_naming_the_fix(monkeypatch):
    monkeypatch.chdir(REPO)
    recipe = "config/recipes/rl_a14b_rule.yaml"
    for preset in ("flow_grpo_fast", "grpo_guard", "diffusion_nft"):
        with pytest.raises(ConfigError, match=r"set parallel.tensor_parallel: 1"):
            config.load(layers(preset, recipe))
    assert config.setting_warnings(config.load(layers("mixgrpo", recipe))) == []


def test_a_dry_run_of_a_recipe_with_a_preset_plans_the_run():
    """As docs/options.md shows it (offline: a dry run reaches no network): the recipe's stages, the held-out check
    at the preset's sampler."""
    args = ["snakemake", "-n", "--configfile", "config/recipes/rl_5b_cps.yaml", "config/algorithms/grpo_guard.yaml"]
    out = run(args, REPO, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    jobs = jobs_run(out.stdout + out.stderr)
    assert jobs["train"] == 1 and "warning: grpo." not in out.stderr  # the preset neuters nothing
    assert "flowgrpo_sde-0.7" in out.stdout  # the held-out check's column: the preset's sampler


def cfg_with(train: dict | None = None, **grpo):
    return config.from_dict({"grpo": grpo, "train": train or {}}, partial=True)


@pytest.mark.parametrize(
    ("neutered", "fixed", "said"),
    [
        (
            {"grpo_guard": True, "sampler": "dancegrpo", "eta": 0.3, "delayed_replay": False},
            {"grpo_guard": True, "sampler": "dancegrpo", "eta": 0.3, "delayed_replay": False, "updates_per_batch": 2},
            "the ratio is exactly 1 and the clip never acts",
        ),
        (
            {"sde_window_size": 3, "sde_window_range": [0, 5]},
            {"sde_window_size": 3, "sde_window_range": [0, 5], "share_group_noise": False},
            "they differ only by its few SDE steps",
        ),
        (
            {"sde_window_size": 3, "timestep_fraction": 0.9, "share_group_noise": False},
            {"sde_window_size": 3, "share_group_noise": False},
            "grpo.timestep_fraction = 0.9 is not used",
        ),
        (
            {"algorithm": "nft", "sampler": "euler", "share_group_noise": False, "delayed_replay": False},
            {
                "algorithm": "nft",
                "sampler": "euler",
                "share_group_noise": False,
                "delayed_replay": False,
                "kl_coeff": 1e-4,
            },
            "DiffusionNFT's authors always add a KL of 1e-4",
        ),
        (
            {"advantage_std": "batch", "prompts_per_step": 1},
            {"advantage_std": "batch", "prompts_per_step": 2},
            "the batch is the group",
        ),
        (
            {"train": {"ema_decay": 0.9, "ema_every": 8, "max_steps": 3}, "updates_per_batch": 2},
            {"train": {"ema_decay": 0.9, "ema_every": 8, "max_steps": 4}, "updates_per_batch": 2},
            "so ema/ would hold the initial weights",
        ),
    ],
    ids=[
        "guard-on-policy",
        "window-shared-noise",
        "window-fraction",
        "nft-without-kl",
        "batch-std-one-prompt",
        "ema-never-blends",
    ],  # fmt: skip
)
def test_each_setting_that_neuters_an_algorithm_is_warned_about_and_its_fix_is_not(neutered, fixed, said):
    (warning,) = config.setting_warnings(cfg_with(**neutered))
    assert said in warning
    assert config.setting_warnings(cfg_with(**fixed)) == []
    # MixGRPO's sliding window shares the noise on purpose: no warning for its authors' setting.
    assert (
        config.setting_warnings(cfg_with(sde_window_size=4, sde_window_mode="sliding", sde_window_range=[0, 23])) == []
    )


def test_videogrpo_config_says_the_warning_and_keeps_every_set(tmp_path):
    """Repeated --set flags all apply (a later one used to replace the earlier ones), and the warning goes to
    stderr, the config to stdout."""
    argv = [str(Path(sys.executable).parent / "videogrpo"), "config"]
    argv += ["--set", "grpo.grpo_guard=true", "--set", "grpo.sampler=dancegrpo", "--set", "grpo.eta=0.3"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "grpo_guard: true" in out.stdout and "sampler: dancegrpo" in out.stdout
    assert out.stderr.startswith("warning: grpo.grpo_guard = true with one update per batch")


@pytest.mark.parametrize("recipe", [None, *RECIPES])
def test_the_comparison_page_names_the_preset_each_run_trained_by(recipe):
    """`videogrpo compare` names a run by the preset whose every setting its train view holds; a run without one,
    or with one setting changed, by none."""
    from videogrpo.evaluation import comparison

    presets = comparison.read_presets(REPO / "config/algorithms")
    assert sorted(presets) == PRESETS
    for preset in PRESETS:
        cfg = config.load([REPO / path for path in layers(preset, recipe)])
        assert comparison.preset_of(config.stage_view(cfg, "train"), presets) == preset
        cfg.train.lr *= 2  # not the authors' any more
        assert comparison.preset_of(config.stage_view(cfg, "train"), presets) == "-"
    plain = config.load([REPO / path for path in layers("mixgrpo", recipe)[:-1]])
    assert comparison.preset_of(config.stage_view(plain, "train"), presets) == "-"


@pytest.mark.parametrize("preset", PRESETS)
def test_simulate_accepts_each_preset_at_the_5b_recipes_world_size(preset):
    """The 5B recipe's 128 ranks with the preset layered after it: the config checks, rank 0's shards and state (the
    EMA's and the old policy's copies as the memory plan counts them), and one rollout with the preset's sampler and
    one replay (or NFT) step on fake tensors."""
    argv = [str(Path(sys.executable).parent / "videogrpo"), "simulate", "--configfile"]
    argv += [*layers(preset, RECIPES[0]), "--ranks", "0"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "world 128" in out.stdout and "1 ranks of 128 checked" in out.stdout
    cfg = config.load(layers(preset, RECIPES[0]))
    assert (re.search(r"EMA [\d.]+ [GM]i?B = plan", out.stdout) is not None) == (cfg.train.ema_decay is not None)
    step = "rollout + NFT at step" if cfg.grpo.algorithm == "nft" else "rollout + replay at step"
    assert step in out.stdout, out.stdout
