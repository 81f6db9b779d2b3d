"""The config holds what the recipe decides; a cluster's sizing is the profile's, the executor's settings the
executor's, and the matrix generates with the settings that already hold them. A field that moved is refused,
naming its new home."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from videogrpo import config
from videogrpo.config.identity import generation_fields
from videogrpo.config.refiners_section import RefinerExpert
from videogrpo.config.retired import RETIRED_FIELDS
from videogrpo.errors import ConfigError
from videogrpo.pipeline import layout
from videogrpo.pipeline.resources import job_resources

REPO = Path(__file__).resolve().parents[1]
SLURM_PROFILE = REPO / "profiles/slurm/config.yaml"
K8S_PROFILE = REPO / "profiles/kubernetes/config.yaml"
# The rules that run as cluster jobs (the others are local rules, run by the driver): what the profiles size.
GPU_RULES = ("train", "preflight", "generate_cell")


def recipe(name: str, *layers: str) -> config.Config:
    files = [REPO / "config/config.yaml", *(REPO / layer for layer in (f"config/recipes/{name}.yaml", *layers))]
    return config.load(files)


@pytest.mark.parametrize(
    ("given", "home"),
    [
        ({"slurm": {"partition": "gpu"}}, "set slurm_partition under default-resources of profiles/slurm/config.yaml"),
        ({"slurm": {"account": "proj"}}, "set slurm_account under default-resources"),
        ({"slurm": {"mem_mb_per_node": 900000}}, "set mem_mb under set-resources: train of profiles/slurm"),
        ({"slurm": {"evaluate_minutes": 60}}, "set runtime (minutes) under set-resources: generate_cell"),
        ({"slurm": {"data_cpus": 8}}, "set cpus_per_task under default-resources of profiles/slurm/config.yaml"),
        ({"slurm": {"gpus_per_node": 4}}, "GPUs follow the topology (parallel.procs_per_node"),
        ({"slurm": {"train_retries": 2}}, "set train.retries"),
        ({"slurm": {}}, "set default-resources, and set-resources per rule, in profiles/slurm/config.yaml"),
        ({"slurm": {"qos": "high"}}, "set default-resources, and set-resources per rule"),  # never a field here
        ({"kubernetes": {"image": "reg/img:1"}}, "give --container-image"),
        ({"kubernetes": {"shm_mb": 1}}, "set shm_mb under set-resources: train of profiles/kubernetes/config.yaml"),
        ({"matrix": {"steps": 30}}, "set grpo.sampling_steps"),
        ({"matrix": {"guidance_scale": 1.0}}, "set grpo.guidance_scale"),
        ({"matrix": {"fps": 16}}, "set video.fps"),
    ],
)
def test_a_field_that_moved_is_refused_naming_its_new_home(given, home):
    """A recipe or cluster layer of an older checkout stops with the field and where its setting lives now, before
    anything runs, never read as something else nor dropped."""
    with pytest.raises(ConfigError) as err:
        config.from_dict(given, partial=True)
    ((section, fields),) = given.items()
    named = f"{section}.{next(iter(fields))}" if fields else section
    assert f"{named}: " in str(err.value) and home in str(err.value)


def test_every_field_that_moved_is_gone_and_has_a_home():
    live = set(config.field_paths())
    assert not live & set(RETIRED_FIELDS), "a field is both live and refused as gone"
    assert {"slurm", "evaluate"} & {path.split(".")[0] for path in live} == set()
    for path, home in RETIRED_FIELDS.items():
        assert re.search(r"\b(set|give|delete|list)\b", home), f"{path}: its message names no fix"


def test_the_config_surface_is_what_the_recipes_decide():
    """What is left of the cluster sections: the multi-node Kubernetes Job's own volume and Secret, and whether a
    one-node run trains as a Job. The field count is the whole surface (every leaf of every section): 153 for the
    reference's system (its split rollout's six among them: the `actors` section), and 51 for the options beyond it
    (docs/options.md; the actors' stall timeout among them), which are off by default, and the prompt refiners' 4
    (their list, its credit, the members kept on the prompt, the rewrites per prompt) with each refiner record's 21."""
    kubernetes = {f.name for f in dataclasses.fields(config.Config().kubernetes)}
    assert kubernetes == {"volume_claim", "volume_path", "train_as_job", "env_secret"}
    assert len(config.field_paths()) == 153 + 51 + 4
    assert len(dataclasses.fields(RefinerExpert)) == 21


@pytest.mark.parametrize(
    ("layers", "shape_from"),
    [
        ((), "video"),
        (("config/recipes/rl_5b_cps.yaml",), "video"),
        (("config/recipes/rl_a14b_rule.yaml",), "matrix"),  # the release evaluation's 81 x 512 x 512
        (("config/recipes/rl_a14b_rule.yaml", "config/matrix/release.yaml"), "matrix"),
    ],
)
def test_a_cell_generates_with_the_training_settings_unless_the_matrix_gives_its_shape(layers, shape_from):
    cfg = config.load([REPO / "config/config.yaml", *(REPO / layer for layer in layers)])
    fields = generation_fields(cfg)
    assert fields["steps"] == "grpo.sampling_steps" and fields["guidance_scale"] == "grpo.guidance_scale"
    assert fields["fps"] == "video.fps" and fields["seed"] == "matrix.seed"
    assert {fields[name] for name in ("num_frames", "height", "width")} == {
        f"{shape_from}.{name}" for name in ("num_frames", "height", "width")
    }
    view = config.flat_fields(config.stage_view(cfg, "generate_cell"))
    assert set(fields.values()) <= set(view)
    scoring = config.flat_fields(config.stage_view(cfg, "score_cell"))
    assert {fields["num_frames"], fields["fps"]} <= set(scoring)


def test_the_training_shape_reaches_the_cells_only_where_the_matrix_gives_none(monkeypatch):
    """A cell's param is where its setting lives: a new video.num_frames reruns (and re-keys) the tiny default's
    cells, and not those of rl_a14b_rule, whose matrix keeps the release shape."""
    monkeypatch.chdir(REPO)
    for layers, follows in (((), True), (("config/recipes/rl_a14b_rule.yaml",), False)):
        base = yaml.safe_load((REPO / "config/config.yaml").read_text())
        for layer in layers:
            base = config.deep_merge(base, yaml.safe_load((REPO / layer).read_text()))
        changed = config.deep_merge(base, {"video": {"num_frames": 33}})
        before, after = config.from_dict(base), config.from_dict(changed)
        tasks = (REPO / before.data.task_list).read_text()
        params = [config.identity_fields(config.stage_view(c, "generate_cell")) for c in (before, after)]
        keys = [layout.matrix_key(c, tasks) for c in (before, after)]
        assert (params[0] != params[1], keys[0] != keys[1]) == (follows, follows), layers


def test_the_workflow_asks_for_what_the_topology_fixes_and_nothing_a_site_chooses():
    site = {"mem_mb", "runtime", "cpus_per_task", "slurm_partition", "slurm_account", "constraint", "machine_type"}
    five_b, a14b = recipe("rl_5b_cps"), recipe("rl_a14b_rule")
    for cfg in (five_b, a14b):
        for kind in ("train", "preflight", "generate", "cpu"):
            for kubernetes in (False, True):
                assert not site & set(job_resources(cfg, kind, kubernetes)), (kind, kubernetes)
    assert job_resources(five_b, "train", False) == {
        "nodes": 16,
        "tasks": 16,
        "tasks_per_gpu": 0,
        "mpi": "srun",  # one launcher per node, started with srun by the rule's shell
        "gres": "gpu:8",
    }
    # One node: no `mpi`, which the SLURM plugin refuses for a job of one task.
    assert job_resources(a14b, "train", False) == {"nodes": 1, "tasks": 1, "tasks_per_gpu": 0, "gres": "gpu:8"}
    assert job_resources(five_b, "preflight", False)["gres"] == "gpu:1"
    released = recipe("rl_5b_cps", "config/matrix/release.yaml")  # matrix.procs 8: a cell on the node's 8 GPUs
    assert job_resources(released, "generate", False)["gres"] == "gpu:8"
    assert job_resources(released, "generate", True) == {"gpu": 8} and job_resources(five_b, "cpu", True) == {}
    tiny = config.load([REPO / "config/config.yaml"])  # parallel.device cpu: no GPU anywhere
    assert "gres" not in job_resources(tiny, "train", False) and job_resources(tiny, "preflight", True) == {}


@pytest.mark.parametrize("profile", [SLURM_PROFILE, K8S_PROFILE])
def test_each_profile_sizes_every_cluster_job_in_one_place(profile):
    """default-resources size the CPU jobs, set-resources each GPU rule; the sizes the config used to default to."""
    settings = yaml.safe_load(profile.read_text())
    defaults, per_rule = settings["default-resources"], settings["set-resources"]
    assert set(per_rule) == set(GPU_RULES)
    assert (defaults["cpus_per_task"], defaults["mem_mb"]) == (16, 32000)
    assert (per_rule["train"]["cpus_per_task"], per_rule["train"]["mem_mb"]) == (64, 512000)
    for rule in ("preflight", "generate_cell"):
        assert (per_rule[rule]["cpus_per_task"], per_rule[rule]["mem_mb"]) == (16, 64000)
    text = profile.read_text()
    assert "set-resources" in text.split("executor:")[0], "the header says where a site sets its sizing"
    if profile == SLURM_PROFILE:
        assert defaults["runtime"] == 480
        assert [per_rule[rule]["runtime"] for rule in GPU_RULES] == [2880, 30, 600]
        assert "# slurm_partition:" in text and "# slurm_account:" in text and "# constraint:" in text
    else:
        assert defaults["gpu_manufacturer"] == "nvidia" and per_rule["train"]["shm_mb"] == 65536
        assert "# machine_type:" in text


def test_a_field_that_moved_is_refused_naming_the_file_that_still_gives_it(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("slurm:\n  partition: gpu\nparallel:\n  nodes: 2\n")
    with pytest.raises(ConfigError) as err:
        config.load([REPO / "config/config.yaml", cluster], {"matrix": {"fps": 8}})
    assert f"{cluster}: slurm.partition: the `slurm` section is gone" in str(err.value)
    assert "--config: matrix.fps: generated videos play at the training frame rate; set video.fps" in str(err.value)
    assert "config/config.yaml:" not in str(err.value)  # the layer that gives none is not blamed
