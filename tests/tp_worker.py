"""One rank of the tensor-parallel checks (run by tests/test_tensor_parallel.py under torchrun, gloo).

argv: mode (`tp`: TP2 on 2 ranks; `tp_fsdp`: dp 2 x tp 2 on 4 ranks), an output folder shared by the ranks.
Every rank builds the same small random WanTransformer3DModel, keeps an unsharded copy as the reference,
and writes what it measured to <out>/rank<r>.json; the test asserts on those numbers.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from diffusers import WanTransformer3DModel

from videogrpo.models.shapes import TINY_TENSOR_PARALLEL_EXPERT
from videogrpo.parallel import process_groups, tensor_parallel

TP = 2
LR = 1e-3


def build(seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**TINY_TENSOR_PARALLEL_EXPERT).float()
    with torch.no_grad():  # norm weights of 1 and zero biases would hide a misaligned shard
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def replica_inputs(replica: int) -> tuple[dict, torch.Tensor]:
    """Replica r's inputs and the fixed direction its loss projects the output on."""
    gen = torch.Generator().manual_seed(1000 + replica)
    inputs = dict(
        hidden_states=torch.randn(1, 36, 2, 4, 4, generator=gen),
        timestep=torch.tensor([100.0 + 400.0 * replica]),
        encoder_hidden_states=torch.randn(1, 6, 16, generator=gen),
    )
    return inputs, torch.randn(1, 16, 2, 4, 4, generator=gen)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def max_diff(a: dict, b: dict) -> float:
    return max(float((full(a[k]).detach() - b[k].detach()).abs().max()) for k in b)


def norm_check(tp_mesh, tp_rank: int) -> dict:
    """HeadShardedRMSNorm on each rank's slice vs torch's RMSNorm on the whole: output, input and weight grads."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 5, 32, generator=gen, requires_grad=True)
    probe = torch.randn(2, 5, 32, generator=gen)
    ref = torch.nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.3 * torch.randn(32, generator=gen))
    sharded = tensor_parallel.HeadShardedRMSNorm(copy.deepcopy(ref), tp_mesh)
    y = ref(x)
    (y * probe).sum().backward()
    part = slice(16 * tp_rank, 16 * (tp_rank + 1))
    x_local = x.detach()[..., part].clone().requires_grad_(True)
    y_local = sharded(x_local)
    # Each rank's loss is its slice's share of the whole loss; the all-reduce's backward adds the peers' parts.
    (y_local * probe[..., part]).sum().backward()
    return {
        "norm_out": float((y_local - y[..., part]).detach().abs().max()),
        "norm_input_grad": float((x_local.grad - x.grad[..., part]).abs().max()),
        "norm_weight_grad": float((sharded.weight.grad.full_tensor() - ref.weight.grad).abs().max()),
        "norm_weight_local": list(sharded.weight.to_local().shape),
        "norm_local_only_gap": float(
            (y_local - torch.nn.functional.rms_norm(x_local, (16,), sharded.weight.to_local(), 1e-6))
            .detach()
            .abs()
            .max()
        ),
    }


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    ctx = process_groups.init("cpu", "gloo", 1)
    data_parallel = "replicate" if mode == "tp" else "fsdp"
    dims = tensor_parallel.mesh_dims(ctx.world_size, TP, data_parallel)
    dp_rank, tp_rank = dims.dp_rank(ctx.rank), dims.tp_rank(ctx.rank)

    ref = build(0)
    model, mesh = tensor_parallel.parallelize_model(
        copy.deepcopy(ref), dims, "cpu", "gloo", data_parallel, torch.float32, torch.float32
    )
    report: dict = {
        "rank": ctx.rank,
        "dp_rank": dp_rank,
        "tp_rank": tp_rank,
        "mesh": mesh.mesh.tolist(),
        "mesh_dims": list(mesh.mesh_dim_names),
        "local_heads": [b.attn1.heads for b in model.blocks] + [b.attn2.heads for b in model.blocks],
        "to_q_local": list(model.blocks[0].attn1.to_q.weight.to_local().shape),
        "to_out_local": list(model.blocks[0].attn1.to_out[0].weight.to_local().shape),
    }

    # The reference: the unsharded model on every replica's inputs, loss averaged over replicas (as FSDP
    # averages gradients over "dp"); TP peers share a replica's inputs.
    ref_outputs = []
    for r in range(dims.dp):
        inputs, probe = replica_inputs(r)
        sample = ref(**inputs).sample
        ref_outputs.append(sample.detach())
        ((sample * probe).sum() / dims.dp).backward()
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}

    inputs, probe = replica_inputs(dp_rank)
    sample = model(**inputs).sample
    (sample * probe).sum().backward()
    report["out"] = float((sample.detach() - ref_outputs[dp_rank]).abs().max())
    peers = [torch.empty_like(sample) for _ in range(TP)]
    dist.all_gather(peers, sample.detach().contiguous(), group=mesh["tp"].get_group())
    report["tp_peers_equal"] = all(torch.equal(peers[0], p) for p in peers[1:])
    grads = {n: p.grad for n, p in model.named_parameters()}
    report["grads_missing"] = sorted(n for n in ref_grads if grads.get(n) is None)
    report["grad"] = max_diff(grads, ref_grads)
    report["grad_max"] = max(float(g.abs().max()) for g in ref_grads.values())
    report["dtensor_params"] = sum(hasattr(p, "full_tensor") for p in model.parameters())
    ref_norm = torch.nn.utils.get_total_norm(list(ref_grads.values()))
    report["ref_grad_norm"] = float(ref_norm)
    report["grad_norm"] = abs(float(tensor_parallel.grad_norm(list(model.parameters()))) - float(ref_norm))

    # One AdamW step. Its first step is about lr x sign(grad), so a gradient that is zero in exact arithmetic
    # (to_k's bias: softmax ignores a shift common to all keys) flips with round-off: the own-gradient step
    # is reported, and the optimizer is checked on identical gradients (the reference given the TP ones).
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    own = copy.deepcopy(ref)
    torch.optim.AdamW(own.parameters(), lr=LR, weight_decay=0.01).step()
    for n, p in ref.named_parameters():
        p.grad = full(grads[n]).detach().clone()
    torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=0.01).step()
    torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01).step()
    params = dict(model.named_parameters())
    ref_params = dict(ref.named_parameters())
    report["step"] = max_diff(params, ref_params)
    report["step_moved"] = max_diff(params, before)
    report["step_own_grads"] = max_diff(params, dict(own.named_parameters()))

    # Clipping to half the norm (parallelize.clip_grad_norm, torch's, fails on TP x FSDP's two meshes).
    all_params = list(model.parameters())
    report["clip_returned"] = tensor_parallel.clip_grad_norm(all_params, float(ref_norm) / 2) / float(ref_norm)
    report["clip_after"] = float(tensor_parallel.grad_norm(all_params)) / (float(ref_norm) / 2)

    if mode == "tp":
        report.update(norm_check(mesh["tp"], tp_rank))
        report.update(variants_check(dims, ref_outputs[0], ref_grads))
    else:
        report.update(dcp_round_trip(model, dims, out / "checkpoint"))
        report.update(bf16_check(dims, dp_rank, ref_outputs[dp_rank]))
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
    process_groups.shutdown()


def variants_check(dims, ref_output: torch.Tensor, ref_grads: dict) -> dict:
    """As the recipe trains: gradient checkpointing on, blocks compiled (aot_eager: dynamo and autograd tracing
    without a C++ compiler); outputs and gradients vs the unsharded model's."""
    found = {}
    for variant in ("checkpointing", "compiled"):
        model, _ = tensor_parallel.parallelize_model(build(0), dims, "cpu", "gloo", "replicate", torch.float32, None)
        if variant == "checkpointing":
            model.enable_gradient_checkpointing()
        else:
            for block in model.blocks:
                block.compile(backend="aot_eager")
        inputs, probe = replica_inputs(0)
        sample = model(**inputs).sample
        (sample * probe).sum().backward()
        found[f"{variant}_out"] = float((sample.detach() - ref_output).abs().max())
        found[f"{variant}_grad"] = max_diff({n: p.grad for n, p in model.named_parameters()}, ref_grads)
    return found


def bf16_check(dims, dp_rank: int, ref_output: torch.Tensor) -> dict:
    """TP x FSDP with bfloat16 compute (the recipe's param_dtype): runs, and stays near the float32 output."""
    model, _ = tensor_parallel.parallelize_model(build(0), dims, "cpu", "gloo", "fsdp", torch.bfloat16, torch.float32)
    inputs, probe = replica_inputs(dp_rank)
    # As WanTI2V.velocity hands them over: activations in the compute dtype, the timestep as it is.
    for key in ("hidden_states", "encoder_hidden_states"):
        inputs[key] = inputs[key].bfloat16()
    sample = model(**inputs).sample
    (sample.float() * probe).sum().backward()
    grads_finite = all(bool(torch.isfinite(p.grad.full_tensor()).all()) for p in model.parameters())
    return {
        "bf16_dtype": str(sample.dtype),
        "bf16_relative_out": float((sample.float() - ref_output).abs().max() / ref_output.abs().max()),
        "bf16_grads_finite": grads_finite,
    }


def dcp_round_trip(model, dims, where: Path) -> dict:
    """Save the TP x FSDP model with torch.distributed.checkpoint, load it into a differently seeded twin."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    saved = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    dcp.save(get_model_state_dict(model), checkpoint_id=str(where))
    twin, _ = tensor_parallel.parallelize_model(build(1), dims, "cpu", "gloo", "fsdp", torch.float32, torch.float32)
    differed = max_diff(dict(twin.named_parameters()), saved)
    state = get_model_state_dict(twin)
    dcp.load(state, checkpoint_id=str(where))
    set_model_state_dict(twin, state)
    loaded = {n: p.full_tensor() for n, p in twin.named_parameters()}
    return {
        "dcp_differed_before": differed,
        "dcp_identical": sorted(loaded) == sorted(saved) and all(torch.equal(loaded[n], saved[n]) for n in saved),
        "dcp_placements": sorted({str(p.placements) for p in twin.parameters()}),
    }


if __name__ == "__main__":
    main()
