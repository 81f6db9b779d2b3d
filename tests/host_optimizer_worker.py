"""One rank of the optimizer-offload checks (run by tests/test_host_optimizer.py under torchrun, gloo, 4 ranks).

argv: an output folder shared by the ranks. For each layout (replicate, fsdp, hsdp 2 x 2, tp 2 x fsdp 2) every rank
builds two tiny experts (`high`, `low`: the A14B path, one joint clipping norm) twice through Experts.build, once
with torch's AdamW on the device and once with parallel.offload_optimizer and offload_gradients, trains both on
the same inputs (update 2 serves `high` only: `low` has no gradient and must not move), saves both with the
trainer's checkpoint.save, loads the device run's checkpoint into a third, offloaded, build and trains all three
one update more. It writes <out>/rank<r>.json: for each layout whether every local shard, every AdamW state
tensor and every norm are equal bit for bit, and what the offloaded optimizer's books say.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel

from videogrpo.config import Config
from videogrpo.grpo import checkpoint, host_optimizer
from videogrpo.grpo.experts import Experts
from videogrpo.models.shapes import TINY_TENSOR_PARALLEL_EXPERT
from videogrpo.parallel import process_groups

LAYOUTS = {
    "replicate": dict(data_parallel="replicate"),
    "fsdp": dict(data_parallel="fsdp"),
    "hsdp": dict(data_parallel="hsdp", shard_group_size=2),
    "tp_fsdp": dict(data_parallel="fsdp", tensor_parallel=2),
}
SERVED = ({"high", "low"}, {"high"}, {"high", "low"}, {"high", "low"})
"""The experts that serve a replayed step in each update (the last one after the resume)."""


def build(seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**TINY_TENSOR_PARALLEL_EXPERT).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def config(layout: str, offload: bool) -> Config:
    cfg = Config()
    parallel = dict(
        LAYOUTS[layout],
        nodes=1,
        procs_per_node=4,
        device="cpu",
        backend="gloo",
        compile=False,
        param_dtype="float32",
        offload_optimizer=offload,
        offload_gradients=offload,
    )
    parallel.setdefault("tensor_parallel", 1)
    return dataclasses.replace(
        cfg,
        parallel=dataclasses.replace(cfg.parallel, **parallel),
        train=dataclasses.replace(cfg.train, gradient_checkpointing=False, lr=1e-3, weight_decay=0.01),
        grpo=dataclasses.replace(cfg.grpo, kl_coeff=0.0),
    )


def experts(layout: str, offload: bool, world: int) -> Experts:
    raw = {"high": build(1), "low": build(2)}
    return Experts.build(raw, True, config(layout, offload), world, torch.device("cpu"))


def update(e: Experts, rank: int, update_index: int) -> float:
    """One update: each served expert's loss on this replica's inputs, then Experts.step (clipping at a norm below
    the gradients', so the joint clip scales them)."""
    replica = e.mesh_dims.dp_rank(rank) if e.mesh_dims else rank
    gen = torch.Generator().manual_seed(1000 * update_index + replica)
    for name in ("high", "low"):
        inputs = dict(
            hidden_states=torch.randn(1, 36, 2, 4, 4, generator=gen),
            timestep=torch.tensor([100.0 + 300.0 * replica]),
            encoder_hidden_states=torch.randn(1, 6, 16, generator=gen),
        )
        probe = torch.randn(1, 16, 2, 4, 4, generator=gen)
        if name in SERVED[update_index]:
            expert = e.policy[name]
            (expert(**inputs).sample * probe).sum().backward()
    return e.step(1e-3 * (update_index + 1), max_norm=0.5)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def same_state(a: Experts, b: Experts) -> dict:
    """Whether every local shard and every AdamW state tensor of `a` equals `b`'s bit for bit."""
    weights = state = True
    for ea, eb in zip(a.experts, b.experts, strict=True):
        for pa, pb in zip(ea.params, eb.params, strict=True):
            weights &= torch.equal(local(pa.detach()), local(pb.detach()))
            sa, sb = ea.optimizer.state.get(pa, {}), eb.optimizer.state.get(pb, {})
            state &= sorted(sa) == sorted(sb)
            state &= all(torch.equal(local(sa[k]), local(sb[k])) for k in sa if k in sb)
    return {"weights": bool(weights), "state": bool(state)}


def books(e: Experts) -> dict:
    opts = [x.optimizer for x in e.experts]
    return {
        "host_optimizers": all(isinstance(o, host_optimizer.HostAdamW) for o in opts),
        "misplaced": [m for o in opts for m in o.misplaced()],
        "moves": sorted({what for o in opts for what, _ in o.moves}),
        "low_steps": sorted({float(s["step"]) for s in e.experts[1].optimizer.state.values()}),
        # Host master copies read from the device per parameter: once at the first step, never again unless written.
        "refreshes_per_param": [sum(what == "master refresh" for what, _ in o.moves) / len(o.masters) for o in opts],
    }


def gradient_check(found: list[bool]):
    """A step pre-hook recording, per parameter, whether a gradient is still on the device when the step starts."""

    def hook(optimizer, args, kwargs):
        found.extend(p.grad is not None for p in optimizer.params_in_order)

    return hook


def main() -> None:
    out = Path(sys.argv[1])
    ctx = process_groups.init("cpu", "gloo", 1)
    report: dict = {"rank": ctx.rank}
    for layout in LAYOUTS:
        device, offloaded = experts(layout, False, ctx.world_size), experts(layout, True, ctx.world_size)
        # Gradients leave the device before the host step: checked where the step starts.
        on_device: list[bool] = []
        for x in offloaded.experts:
            x.optimizer.register_step_pre_hook(gradient_check(on_device))
        norms = []
        for i in range(3):
            norms.append((update(device, ctx.rank, i), update(offloaded, ctx.rank, i)))
        found = {"norms_equal": all(a == b for a, b in norms), "after_3": same_state(device, offloaded)}
        found["device_gradients_at_step"] = any(on_device)
        found["books"] = books(offloaded)
        root = out / layout
        for name, run in (("device", device), ("offloaded", offloaded)):
            checkpoint.save(root / name, 3, run.parts(), None, {"update": 3}, ctx.rank, keep=1)
        # Resume the device run's checkpoint with offload on, and the offloaded run's with it off.
        resumed_on, resumed_off = experts(layout, True, ctx.world_size), experts(layout, False, ctx.world_size)
        checkpoint.load(checkpoint.step_dir(root / "device", 3), resumed_on.parts(), None, ctx.rank, False)
        checkpoint.load(checkpoint.step_dir(root / "offloaded", 3), resumed_off.parts(), None, ctx.rank, False)
        found["loaded_on"] = same_state(device, resumed_on)
        found["loaded_off"] = same_state(device, resumed_off)
        last = [update(run, ctx.rank, 3) for run in (device, offloaded, resumed_on, resumed_off)]
        found["resumed_norms_equal"] = len(set(last)) == 1
        found["after_resume"] = [same_state(device, run) for run in (offloaded, resumed_on, resumed_off)]
        report[layout] = found
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
    process_groups.shutdown()


if __name__ == "__main__":
    main()
