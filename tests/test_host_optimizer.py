"""Optimizer and gradient offload (parallel.offload_optimizer, parallel.offload_gradients): the same update as torch's
AdamW on the device, bit for bit on CPU, in every layout, through checkpoints in both directions.

On CPU the device and the host are both `cpu`, so placement is read from the optimizer's books
(grpo/host_optimizer.py): every AdamW state tensor must be one the offloaded optimizer allocated on the host, and a
step pre-hook records whether any gradient is still on the device when the host step starts. The layouts run in
tests/host_optimizer_worker.py under torchrun (4 gloo ranks); the whole trainer runs in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from videogrpo.grpo import host_optimizer

from harness import metrics, solo_config, tensors, trainer_in_process, weights

REPO = Path(__file__).parents[1]
LAYOUTS = ("replicate", "fsdp", "hsdp", "tp_fsdp")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("host_optimizer")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
            str(REPO / "tests/host_optimizer_worker.py"), str(out)]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_offloaded_updates_equal_the_device_optimizers_bit_for_bit(reports, layout):
    """Two experts (one joint clipping norm, the second idle in update 2) over 3 updates: every local shard, every
    AdamW moment and step count, and every clipping norm equal to torch's AdamW on the device."""
    for report in reports:
        found = report[layout]
        assert found["norms_equal"]
        assert found["after_3"] == {"weights": True, "state": True}
        assert found["books"]["low_steps"] == [2.0]  # the idle expert's moments and step count did not move


@pytest.mark.parametrize("layout", LAYOUTS)
def test_moments_live_on_the_host_and_gradients_leave_the_device_before_the_step(reports, layout):
    for report in reports:
        books = report[layout]["books"]
        assert books["host_optimizers"]
        assert books["misplaced"] == []  # every moment is a host tensor of the books
        assert not report[layout]["device_gradients_at_step"]  # offload_gradients: none left on the device
        assert books["moves"] == ["gradients", "master refresh", "weights"]
        assert books["refreshes_per_param"] == [1.0, 1.0]  # the host master is read from the device once


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoints_resume_bit_identically_with_offload_turned_on_or_off(reports, layout):
    """The device run's checkpoint resumed with offload on, the offloaded run's with it off: the loaded state is
    the saved one and the next update equals the uninterrupted device run's."""
    for report in reports:
        found = report[layout]
        assert found["loaded_on"] == found["loaded_off"] == {"weights": True, "state": True}
        assert found["resumed_norms_equal"]
        assert found["after_resume"] == [{"weights": True, "state": True}] * 3


def test_the_trainer_with_offload_trains_the_same_bytes(tiny_model, dataset, tmp_path):
    """The whole trainer (TI2V, 2 updates, a checkpoint each): the same weights, metrics and AdamW state."""
    runs = {}
    for name, offload in (("device", False), ("offloaded", True)):
        cfg = solo_config(
            train={"max_steps": 2, "save_steps": 1},
            parallel={"offload_optimizer": offload, "offload_gradients": offload},
        )
        trainer = trainer_in_process(cfg, tmp_path / name, tiny_model, dataset)
        trainer.run()
        runs[name] = trainer
    [device], [offloaded] = (runs[n].experts.experts for n in ("device", "offloaded"))
    assert isinstance(offloaded.optimizer, host_optimizer.HostAdamW)
    assert type(device.optimizer) is torch.optim.AdamW  # off: torch's AdamW, as before the option existed
    assert offloaded.optimizer.misplaced() == []
    assert weights(tmp_path / "offloaded") == weights(tmp_path / "device")
    strip = [[{k: v for k, v in m.items() if not k.startswith("time_")} for m in metrics(tmp_path / n)] for n in runs]
    assert strip[0] == strip[1]
    for p, q in zip(device.params, offloaded.params, strict=True):
        a, b = device.optimizer.state[p], offloaded.optimizer.state[q]
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert tensors(tmp_path / "offloaded").keys() == tensors(tmp_path / "device").keys()


def test_offloading_gradients_alone_is_refused_naming_both_fields():
    from videogrpo import config
    from videogrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"parallel.offload_gradients = true: .*parallel.offload_optimizer = true"):
        config.from_dict(solo_config(parallel={"offload_gradients": True}))
