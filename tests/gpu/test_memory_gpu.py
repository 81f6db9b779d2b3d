"""The memory plan and the offload schedule against a real GPU: what CPU tests cannot measure."""

from __future__ import annotations

import pytest

from videogrpo.config import from_dict
from videogrpo.demo.smoke_run import one_process_config, shaped_pipeline, synthetic_inputs, train_one_process
from videogrpo.models.shapes import MID_TI2V
from videogrpo.preflight import memory_plan, model_shape

from harness import TINY


@pytest.mark.parametrize("offload", [False, True])
def test_the_plan_bounds_the_measured_peak(tmp_path, offload):
    """The plan is what preflight refuses by: it must not be below what a run allocates, nor far above it."""
    dataset, kit = synthetic_inputs(tmp_path)
    model = shaped_pipeline(tmp_path / "mid", MID_TI2V, 1024)
    cfg = one_process_config(TINY, kit, 17, 256, 256, 4, 4, 2, cuda=True)
    cfg["train"]["offload_inference_models"] = offload
    metrics = train_one_process(tmp_path, f"plan-{offload}", cfg, model, dataset)
    assert metrics, "the run failed (log printed above)"
    measured = max(m["peak_memory_bytes"] for m in metrics)
    plan = memory_plan.plan_for_config(from_dict(cfg), model_shape.ModelShape.from_model_dir(model))
    print(f"offload {offload}: measured peak {memory_plan.gib(measured)}, planned {memory_plan.gib(plan.peak)}")
    print("\n".join(plan.lines()))
    assert measured <= plan.peak, "the plan is below the measured peak: preflight would pass runs that run out"
    assert measured >= 0.4 * plan.peak, "the plan is over 2.5 x the measured peak: preflight would refuse runs that fit"
