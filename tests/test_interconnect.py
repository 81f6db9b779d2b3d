"""Interconnect settings: the NCCL and EFA variables a cluster profile gives training (the train rule's
`interconnect_env` resource), on their way to every node's workers, into the train manifest, and out of the run
identity and the stage's params."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from demo import copy_checkout, run

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.launch import torchrun
from videogrpo.pipeline.stage_config import config_text, param_texts
from videogrpo.provenance import interconnect
from videogrpo.provenance.manifest import StageRun

REPO = Path(__file__).resolve().parents[1]
PROFILES = [REPO / "profiles/slurm/config.yaml", REPO / "profiles/kubernetes/config.yaml"]
EFA = {"NCCL_DEBUG": "WARN", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.parent.name)
def test_each_profile_gives_the_settings_under_set_resources_train_with_the_aws_set_beside_them(profile):
    text = profile.read_text()
    train = yaml.safe_load(text)["set-resources"]["train"]
    assert interconnect.parse(train[interconnect.RESOURCE], str(profile)) == {"NCCL_DEBUG": "WARN"}
    # The AWS EFA set, commented right below the active line: uncommented, it is a valid setting.
    lines = text.splitlines()
    active = lines.index('    interconnect_env: "NCCL_DEBUG=WARN"')
    (aws,) = [line for line in lines[active:] if line.startswith("    # interconnect_env: ")]
    assert lines.index(aws) - active < 8 and "# On AWS GPU instances with EFA" in lines[active + 1]
    uncommented = yaml.safe_load(aws.replace("# ", "", 1).strip())[interconnect.RESOURCE]
    assert interconnect.parse(uncommented, str(profile)) == EFA
    assert "docs/options.md#interconnect-settings" in text
    # The page it points to says where the settings go, for both profiles.
    section = (REPO / "docs/options.md").read_text().split("## Interconnect settings")[1]
    assert "set-resources: train" in section and "interconnect_env" in section
    assert f"profiles/{profile.parent.name}/config.yaml" in section


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("PYTHONPATH=/x", "PYTHONPATH is not an interconnect variable"),
        ("NCCL_DEBUG", "'NCCL_DEBUG' is not NAME=value"),
        ("NCCL_DEBUG=WARN NCCL_DEBUG=INFO", "NCCL_DEBUG is given twice ('WARN' and 'INFO')"),
        ("FI_PROVIDER='efa", "is not a list of NAME=value"),
    ],
)
def test_a_bad_setting_is_refused_naming_where_it_was_written_and_the_fix(text, needle):
    with pytest.raises(ConfigError) as refused:
        interconnect.parse(text, "set-resources: train: interconnect_env of your profile")
    assert str(refused.value).startswith("set-resources: train: interconnect_env of your profile: ")
    assert needle in str(refused.value)


def test_the_settings_parse_with_shell_quoting_and_nothing_is_none():
    assert interconnect.parse("", "x") == {}
    assert interconnect.parse("NCCL_SOCKET_IFNAME='^lo,docker' OFI_NCCL_X=a=b", "x") == {
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "OFI_NCCL_X": "a=b",
    }


def test_the_manifest_records_every_interconnect_variable_and_nothing_else():
    env = {
        "NCCL_DEBUG": "INFO",
        "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
        "FI_PROVIDER": "efa",
        "OFI_NCCL_PROTOCOL": "RDMA",
        "RDMAV_FORK_SAFE": "0",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "FILE": "x",
        "MY_NCCL_THING": "x",
        "WANDB_API_KEY": "secret-value-0123",
    }
    assert interconnect.recorded(env) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "FI_PROVIDER": "efa",
        "NCCL_DEBUG": "INFO",
        "OFI_NCCL_PROTOCOL": "RDMA",
        "RDMAV_FORK_SAFE": "0",
        "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    }


def test_a_stage_manifest_holds_the_interconnect_only_where_the_stage_records_it(tmp_path):
    for recorded, path in (({"NCCL_DEBUG": "WARN"}, tmp_path / "train.json"), (None, tmp_path / "other.json")):
        with StageRun("demo", path, inputs={}) as stage:
            stage.interconnect = recorded
        manifest = json.loads(path.read_text())
        assert manifest.get("interconnect", "absent") == (recorded if recorded is not None else "absent")


def test_what_the_environment_already_sets_wins_and_is_said():
    env = {"FI_PROVIDER": "tcp", "NCCL_DEBUG": "WARN"}
    notes = torchrun.apply_interconnect({"FI_PROVIDER": "efa", "NCCL_DEBUG": "WARN", "OFI_NCCL_X": "1"}, env)
    assert env == {"FI_PROVIDER": "tcp", "NCCL_DEBUG": "WARN", "OFI_NCCL_X": "1"}
    assert notes == [
        "interconnect: FI_PROVIDER=tcp from the environment, not the profile's efa (unset it to use the profile's)"
    ]


CPU_GLOO = {
    "parallel": {"nodes": 1, "procs_per_node": 2, "device": "cpu", "backend": "gloo", "attention_backend": "native"}
}
# The train stage as the rule runs it, with the trainer's worker replaced by tests/interconnect_worker.py (which
# reports its environment and trains nothing) and the export check by a stand-in (there are no weights to load).
STAGE = """
import sys
from videogrpo.grpo import checkpoint
from videogrpo.launch import node
node.WORKER = "interconnect_worker"
checkpoint.validate_export = lambda final, model=None: {"stand_in": True}
from videogrpo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_profiles_settings_reach_every_worker_and_the_train_manifest(tmp_path):
    """`videogrpo stage train --interconnect-env ...` through the real launcher and torchrun: both ranks see the
    settings (a variable the environment sets keeps its value, and the log says so), the node's log line names them,
    and the manifest records what the workers saw, outside its params."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    (tmp_path / "dataset/raw").mkdir(parents=True)
    (tmp_path / "dataset/raw/a.txt").write_text("a")
    (tmp_path / "dataset/splits.json").write_text(json.dumps([{"task": "t", "rl": True}]))
    (tmp_path / "preflight.json").write_text("{}")
    run_dir = tmp_path / "run"
    args = ["stage", "train", "--config-json", json.dumps(CPU_GLOO), "--run-id", "r", "--run-dir", str(run_dir)]
    args += ["--model", str(tmp_path / "model"), "--dataset", str(tmp_path / "dataset")]
    args += ["--preflight", str(tmp_path / "preflight.json"), "--final", str(run_dir / "train/final")]
    args += ["--metrics", str(run_dir / "train/metrics.jsonl"), "--manifest", str(run_dir / "train.manifest.json")]
    args += ["--interconnect-env", "NCCL_DEBUG=WARN FI_PROVIDER=efa CUDA_DEVICE_MAX_CONNECTIONS=1"]
    env = {name: value for name, value in os.environ.items() if not interconnect.is_interconnect(name)}
    env["FI_PROVIDER"] = "tcp"  # the submitting environment's: it wins
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), str(REPO / "src"), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", STAGE, *args], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "FI_PROVIDER": "tcp", "NCCL_DEBUG": "WARN"}
    seen["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # torchrun's own, which the manifest records too
    for rank in (0, 1):
        assert json.loads((run_dir / f"interconnect-rank{rank}.json").read_text()) == seen
    assert "[launch] interconnect: " + interconnect.describe(seen) in done.stderr
    assert "interconnect: FI_PROVIDER=tcp from the environment, not the profile's efa" in done.stderr
    manifest = json.loads((run_dir / "train.manifest.json").read_text())
    assert manifest["interconnect"] == seen
    assert not re.search(r"NCCL_|FI_|CUDA_DEVICE", json.dumps(manifest["params"]))


@pytest.mark.parametrize("layers", [[], ["config/recipes/rl_5b_cps.yaml"]], ids=["tiny", "rl_5b_cps"])
def test_the_run_identity_and_the_stages_params_ignore_the_interconnect(layers, monkeypatch):
    def identity_and_params() -> tuple:
        cfg = config.load([REPO / "config/config.yaml", *(REPO / layer for layer in layers)], {})
        return config.run_identity(cfg), param_texts(cfg, "train"), config_text(cfg, "train")

    for name in [name for name in os.environ if interconnect.is_interconnect(name)]:
        monkeypatch.delenv(name)
    without = identity_and_params()
    for name, value in {**EFA, "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}.items():
        monkeypatch.setenv(name, value)
    assert identity_and_params() == without


def test_the_train_rule_hands_the_profiles_settings_to_the_stage_and_refuses_a_bad_one(tmp_path):
    """A dry run with the train rule's interconnect_env resource: the training command carries it, in the same run
    directory as without; a setting outside the interconnect stops the dry run, naming the resource."""
    checkout = copy_checkout(tmp_path / "checkout")
    run_id = run(["videogrpo", "config", "--configfile", "config/config.yaml", "--run-id"], checkout).stdout.strip()
    given = "train:interconnect_env=NCCL_DEBUG=INFO FI_PROVIDER=efa"
    out = run(["snakemake", "-n", "-p", "--set-resources", given, "--", "train"], checkout)
    (shell,) = [line for line in out.stdout.splitlines() if line.startswith("Shell command: videogrpo stage train")]
    assert " --interconnect-env 'NCCL_DEBUG=INFO FI_PROVIDER=efa' " in shell, shell
    assert f" --run-dir results/runs/{run_id} " in shell, shell
    bad = run(
        ["snakemake", "-n", "-p", "--set-resources", "train:interconnect_env=PYTHONPATH=/x", "--", "train"],
        checkout,
        check=False,
    )
    assert bad.returncode != 0
    assert "set-resources: train: interconnect_env of your profile: PYTHONPATH is not an interconnect variable" in (
        bad.stdout + bad.stderr
    )
