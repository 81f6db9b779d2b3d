import pytest

from videogrpo import config, launch
from videogrpo.errors import ConfigError


def cfg(nodes=1, procs=2):
    return config.from_dict({"parallel": {"nodes": nodes, "procs_per_node": procs}}, partial=True)


def test_local_defaults_when_the_contract_is_absent():
    where = launch.from_environment(cfg(), env={})
    assert where == launch.Launch(1, 0, "127.0.0.1", 29500, 2)
    argv = launch.torchrun_argv(where, "m", ["--x"])
    assert "--standalone" in argv and argv[-3:] == ["-m", "m", "--x"] and "--nproc-per-node=2" in argv


def test_manual_multi_machine_contract():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600", "WORLD_SIZE": "2", "RANK": "1"}
    where = launch.from_environment(cfg(nodes=2, procs=8), env=env)
    assert where == launch.Launch(2, 1, "10.0.0.1", 29600, 8)
    argv = launch.torchrun_argv(where, "m", [])
    assert "--nnodes=2" in argv and "--node-rank=1" in argv and "--rdzv-endpoint=10.0.0.1:29600" in argv


@pytest.mark.parametrize("env,message", [
    ({"MASTER_ADDR": "h"}, "WORLD_SIZE, RANK missing"),
    ({"MASTER_ADDR": "h", "WORLD_SIZE": "2", "RANK": "2"}, r"RANK=2 must be in \[0, WORLD_SIZE=2\)"),
    ({"MASTER_ADDR": "h", "WORLD_SIZE": "3", "RANK": "0"}, "parallel.nodes = 2 but this launch has 3 machines"),
])
def test_contract_errors_name_the_variables(env, message):
    with pytest.raises(ConfigError, match=message):
        launch.from_environment(cfg(nodes=2), env=env)
