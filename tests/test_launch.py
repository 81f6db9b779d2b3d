import pytest

from videogrpo import config
from videogrpo.errors import ConfigError
from videogrpo.launch import torchrun


def cfg(nodes=1, procs=2):
    return config.from_dict(
        {"parallel": {"nodes": nodes, "procs_per_node": procs, "device": "cpu", "backend": "gloo"}}, partial=True
    )


def test_local_defaults_when_the_contract_is_absent():
    where = torchrun.from_environment(cfg(), env={})
    assert where == torchrun.Launch(1, 0, "127.0.0.1", 29500, 2, "local")
    argv = torchrun.torchrun_argv(where, "m", ["--x"])
    assert "--standalone" in argv and argv[-3:] == ["-m", "m", "--x"] and "--nproc-per-node=2" in argv


def test_manual_multi_machine_contract():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600", "WORLD_SIZE": "2", "RANK": "1"}
    where = torchrun.from_environment(cfg(nodes=2, procs=8), env=env)
    assert where == torchrun.Launch(2, 1, "10.0.0.1", 29600, 8, "manual")
    argv = torchrun.torchrun_argv(where, "m", [])
    assert "--nnodes=2" in argv and "--rdzv-conf=is_host=false" in argv and "--rdzv-endpoint=10.0.0.1:29600" in argv


@pytest.mark.parametrize(
    "env,message",
    [
        ({"MASTER_ADDR": "h"}, "WORLD_SIZE, RANK missing"),
        ({"MASTER_ADDR": "h", "WORLD_SIZE": "2", "RANK": "2"}, r"RANK=2 must be in \[0, WORLD_SIZE=2\)"),
        (
            {"MASTER_ADDR": "h", "WORLD_SIZE": "3", "RANK": "0"},
            r"parallel.nodes = 2 but this launch has 3 machines \(manual\)",
        ),
    ],
)
def test_contract_errors_name_the_variables(env, message):
    with pytest.raises(ConfigError, match=message):
        torchrun.from_environment(cfg(nodes=2), env=env)


def test_an_srun_task_takes_its_place_from_slurm():
    env = {"SLURM_JOB_ID": "1234", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"}
    where = torchrun.from_environment(cfg(nodes=2, procs=4), env=env)
    assert where == torchrun.Launch(2, 1, "10.1.1.1", 29500 + 234, 4, "slurm")
    assert torchrun.from_environment(cfg(nodes=2), env=dict(env, MASTER_PORT="30000")).master_port == 30000


def test_srun_fans_out_only_from_the_rule_shell_of_a_multi_node_allocation():
    assert torchrun.needs_srun(cfg(nodes=2), env={"SLURM_JOB_ID": "7"})
    assert not torchrun.needs_srun(cfg(nodes=1), env={"SLURM_JOB_ID": "7"})
    assert not torchrun.needs_srun(cfg(nodes=2), env={"SLURM_JOB_ID": "7", "SLURM_NODEID": "0"})
    assert not torchrun.needs_srun(cfg(nodes=2), env={})
    argv = torchrun.srun_argv(cfg(nodes=2), ["videogrpo", "train"])
    assert argv[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"] and "--gres=gpu:2" not in argv
    gpu = config.from_dict(
        {"parallel": {"nodes": 2, "procs_per_node": 8, "device": "cuda", "backend": "nccl"}}, partial=True
    )
    assert "--gres=gpu:8" in torchrun.srun_argv(gpu, ["x"])


def test_workers_get_a_node_local_triton_cache_and_expandable_segments_unless_set():
    env = torchrun.worker_env(cfg(), env={"SLURM_JOB_ID": "77", "TMPDIR": "/local/77", "PATH": "/bin"})
    assert env["TRITON_CACHE_DIR"] == "/local/77/triton-77"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] and env["PATH"] == "/bin"
    user = {"TRITON_CACHE_DIR": "/nvme/t", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    mine = torchrun.worker_env(cfg(), env=user)
    assert mine["TRITON_CACHE_DIR"] == "/nvme/t" and mine["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"


def test_the_preflight_only_fan_out_covers_the_allocation_and_lets_every_node_report():
    four = cfg(nodes=4)
    assert torchrun.allocation_nodes(four, {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3"}) == 3
    assert torchrun.allocation_nodes(four, {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3", "SLURM_NODEID": "1"}) == 0
    assert torchrun.allocation_nodes(four, {}) == 0
    # A Snakemake job's shell: the jobstep plugin leaves SLURM_JOB_ID but strips the node counts.
    assert torchrun.allocation_nodes(four, {"SLURM_JOB_ID": "7"}) == 4
    argv = torchrun.srun_argv(cfg(nodes=16), ["x"], nodes=3, kill_on_bad_exit=False)
    assert argv[:4] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1"]
    assert "--kill-on-bad-exit=1" not in argv and "--kill-on-bad-exit=1" in torchrun.srun_argv(cfg(nodes=2), ["x"])
    # one machine of a 16-node recipe checks itself: its place in the job, not the run's topology
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"}
    assert torchrun.from_environment(cfg(nodes=16), env=env, check_nodes=False).node_rank == 2
    with pytest.raises(ConfigError, match="parallel.nodes = 16 but this launch has 3 machines"):
        torchrun.from_environment(cfg(nodes=16), env=env)
