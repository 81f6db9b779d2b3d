"""Tensor parallel (TP 2) and TP x FSDP of a Wan transformer against the unsharded model
(docs/reference-system.md#a14b).

The multi-process checks run tests/tp_worker.py under torchrun on gloo, once per layout (module fixtures):
TP2 on 2 processes, dp 2 x tp 2 on 4. Each rank compares its sharded model with an unsharded copy on the
same inputs and reports the largest differences; these tests assert on them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from videogrpo.errors import ConfigError
from videogrpo.models.shapes import TINY_TENSOR_PARALLEL_EXPERT
from videogrpo.parallel import tensor_parallel

REPO = Path(__file__).parents[1]
TOL = 2e-5


def run_worker(tmp: Path, mode: str, procs: int) -> list[dict]:
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
        str(REPO / "tests/tp_worker.py"), mode, str(tmp),
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(procs)]


@pytest.fixture(scope="module")
def tp2(tmp_path_factory) -> list[dict]:
    return run_worker(tmp_path_factory.mktemp("tp2"), "tp", 2)


@pytest.fixture(scope="module")
def tp2_fsdp2(tmp_path_factory) -> list[dict]:
    return run_worker(tmp_path_factory.mktemp("tp2_fsdp2"), "tp_fsdp", 4)


@pytest.fixture(params=["tp2", "tp2_fsdp2"])
def reports(request) -> list[dict]:
    return request.getfixturevalue(request.param)


def test_ranks_map_row_major_onto_the_dp_tp_mesh(tp2, tp2_fsdp2):
    assert [(r["dp_rank"], r["tp_rank"]) for r in tp2_fsdp2] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {json.dumps(r["mesh"]) for r in tp2_fsdp2} == {"[[0, 1], [2, 3]]"}
    assert {tuple(r["mesh_dims"]) for r in tp2 + tp2_fsdp2} == {("dp", "tp")}
    dims = tensor_parallel.mesh_dims(8, 2, "fsdp")
    assert (dims.dp, [dims.dp_rank(r) for r in range(8)], [dims.tp_rank(r) for r in range(8)]) == (
        4,
        [0, 0, 1, 1, 2, 2, 3, 3],
        [0, 1, 0, 1, 0, 1, 0, 1],
    )


def test_each_rank_holds_half_the_heads_and_projections(tp2, tp2_fsdp2):
    for r in tp2 + tp2_fsdp2:
        assert r["local_heads"] == [2, 2, 2, 2]  # 4 heads / TP 2, in attn1 and attn2 of both blocks
    # to_q: 32 output features split over tp (16), then FSDP halves dim 0 again over dp; to_out splits inputs.
    assert {tuple(r["to_q_local"]) for r in tp2} == {(16, 32)}
    assert {tuple(r["to_out_local"]) for r in tp2} == {(32, 16)}
    assert {tuple(r["to_q_local"]) for r in tp2_fsdp2} == {(8, 32)}
    assert {tuple(r["to_out_local"]) for r in tp2_fsdp2} == {(16, 16)}


def test_outputs_and_every_gradient_match_the_unsharded_model(reports):
    for r in reports:
        assert r["grads_missing"] == []
        assert r["out"] <= TOL, r
        assert r["grad"] <= TOL, r  # the largest gradient entry is ~10, so this is float32 round-off
        assert r["grad_max"] > 1.0
        assert r["tp_peers_equal"] is True
        assert r["grad_norm"] <= 1e-6 * r["ref_grad_norm"], r


def test_clipping_scales_every_shard_to_the_global_norm(reports):
    for r in reports:
        assert abs(r["clip_returned"] - 1) <= 1e-6, r  # the pre-clip norm, as the unsharded one
        assert abs(r["clip_after"] - 1) <= 1e-5, r


def test_one_adamw_step_matches_the_unsharded_step(reports):
    for r in reports:
        assert r["step_moved"] > 5e-4  # the step moved the weights (lr 1e-3)
        assert r["step"] <= 1e-6, r


def test_tp_x_fsdp_shards_tp_shards_over_dp_and_round_trips_through_dcp(tp2_fsdp2):
    for r in tp2_fsdp2:
        # Replicated parameters: Shard(0) over dp only; TP ones: 2-D (dp, tp).
        assert "(Shard(dim=0),)" in r["dcp_placements"]
        assert any(p.endswith("Shard(dim=1))") for p in r["dcp_placements"])  # row-wise weights
        assert r["dcp_differed_before"] > 0.1  # the twin started from other weights
        assert r["dcp_identical"] is True


def test_rms_norm_across_heads_under_tp_equals_the_unsharded_one(tp2):
    for r in tp2:
        assert r["norm_weight_local"] == [16]
        assert r["norm_out"] <= 1e-6
        assert r["norm_input_grad"] <= 1e-6
        assert r["norm_weight_grad"] <= 1e-5
        # Normalising only the local heads would be visibly different: the all-reduce matters.
        assert r["norm_local_only_gap"] > 0.05


def test_the_sharded_norm_stays_out_of_compiled_graphs(monkeypatch):
    import torch.distributed.nn.functional as dist_functional

    monkeypatch.setattr(dist_functional, "all_reduce", lambda x, group=None: x)  # a world of one
    norm = tensor_parallel.HeadShardedRMSNorm.__new__(tensor_parallel.HeadShardedRMSNorm)
    torch.nn.Module.__init__(norm)  # without a mesh: a plain weight, no group
    norm.full_dim, norm.eps, norm.group, norm.weight = 8, 1e-6, None, torch.nn.Parameter(torch.ones(8))

    def forward(x):
        return norm(x * 2) + 1

    explained = torch._dynamo.explain(forward)(torch.randn(2, 8))
    assert explained.graph_break_count == 1
    assert "torch.compiler.disable" in str(explained.break_reasons[0].reason)


def test_checkpointed_and_compiled_tp_blocks_match_the_unsharded_model(tp2):
    for r in tp2:
        for variant in ("checkpointing", "compiled"):
            assert r[f"{variant}_out"] <= TOL, r
            assert r[f"{variant}_grad"] <= TOL, r


def test_tp_x_fsdp_runs_in_bfloat16_near_the_float32_output(tp2_fsdp2):
    for r in tp2_fsdp2:
        assert r["bf16_dtype"] == "torch.bfloat16"
        assert r["bf16_relative_out"] <= 0.05, r
        assert r["bf16_grads_finite"] is True


def tiny_model(**config):
    from diffusers import WanTransformer3DModel

    # One block is enough to refuse or pass; the shape's 4 heads and FFN of 32 split over 2 and 4.
    return WanTransformer3DModel(**{**TINY_TENSOR_PARALLEL_EXPERT, "num_layers": 1, **config})


@pytest.mark.parametrize(
    "config, tp, words",
    [
        ({"num_attention_heads": 3}, 2, "3 attention heads are not divisible by tensor_parallel = 2"),
        ({"ffn_dim": 30}, 4, "feed-forward size 30 is not divisible by tensor_parallel = 4"),
        ({"added_kv_proj_dim": 16}, 2, "image K/V projections (added_kv_proj_dim = 16)"),
    ],
)
def test_refuses_what_the_plan_cannot_split(config, tp, words):
    with pytest.raises(ConfigError) as err:
        tensor_parallel.check_model(tiny_model(**config), tp)
    assert words in str(err.value)
    tensor_parallel.check_model(tiny_model(), 2)  # the divisible model passes


def test_refuses_fused_projections():
    model = tiny_model()
    model.fuse_qkv_projections()
    with pytest.raises(ConfigError, match=r"blocks\.0\.attn1: fused Q/K/V projections .* tensor_parallel = 2"):
        tensor_parallel.check_model(model, 2)


@pytest.mark.parametrize(
    "world, tp, mode, words",
    [
        (6, 4, "fsdp", "tensor_parallel = 4: must divide the world size 6"),
        (8, 2, "hsdp", "'hsdp' with parallel.tensor_parallel = 2"),
        (4, 2, "replicate", "'replicate' with parallel.tensor_parallel = 2 and 2 data replicas"),
        (4, 1, "fsdp", "tensor_parallel = 1"),
    ],
)
def test_refuses_meshes_it_cannot_build(world, tp, mode, words):
    with pytest.raises(ConfigError) as err:
        tensor_parallel.mesh_dims(world, tp, mode)
    assert words in str(err.value)
    assert tensor_parallel.mesh_dims(2, 2, "replicate").dp == 1
