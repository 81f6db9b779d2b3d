"""`videogrpo simulate`: the released recipes' real shapes on torch's fake process group at their world sizes.

The commands below are the ones docs/gpus.md shows. What each checks would fail if the mesh arithmetic broke: with the
replicate and shard dimensions of the HSDP mesh swapped in parallel/fsdp.py, every rank shards over 16 ranks instead
of 8 and its master weights fall to about half of the plan's, which the comparison reports (exit 2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import doc_commands
import pytest

from videogrpo.parallel import shard_layout

REPO = Path(__file__).resolve().parents[1]
VIDEOGRPO = str(Path(sys.executable).parent / "videogrpo")


def run(*args: str) -> subprocess.CompletedProcess:
    argv = ["videogrpo", "simulate", *args]
    out = subprocess.run([VIDEOGRPO, *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=900)
    doc_commands.record(argv, out.returncode)
    return out


def rank_lines(stdout: str) -> dict[int, str]:
    return {int(m.group(1)): line for line in stdout.splitlines() if (m := re.match(r"rank\s+(\d+) ", line))}


def test_the_5b_recipe_shards_as_planned_on_every_shard_group_at_128_ranks():
    out = run("--configfile", "config/recipes/rl_5b_cps.yaml", "--no-steps")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = rank_lines(out.stdout)
    # The first and last rank and the first of each of the 16 shard groups of 8, as many at a time as there are
    # cores for this process, reported in rank order.
    assert list(lines) == [*range(0, 128, 8), 127]
    for rank, line in lines.items():
        shard = f"fsdp {rank % 8}/8"
        assert shard in line and "master weights 2.33 GiB = plan" in line and line.endswith(": ok"), line
        assert "825 parameters" in line and "DCP plan 3312 items" in line
    # Shard 0 holds the one-row modulation tables whole; the last shard of a group holds none of them.
    held = {r: int(re.search(r"([\d,]+) elements held", line).group(1).replace(",", "")) for r, line in lines.items()}
    assert held[0] == held[120] > held[127]
    jobs = len(os.sched_getaffinity(0))
    assert re.search(rf"17 ranks of 128 checked in \d+ s \({jobs} at a time\)", out.stdout), out.stdout


def test_a_rollout_and_a_replay_step_run_on_fake_tensors_at_the_recipe_shape():
    out = run("--configfile", "config/recipes/rl_5b_cps.yaml", "--ranks", "127")
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = rank_lines(out.stdout).values()
    # 81 frames at 512 x 512: 21 x 16 x 16 tokens; 32 prompts x 32 members over 128 ranks: 8 rows a rank.
    assert "rollout + replay at step 0: 8 rows x 5,376 tokens" in line and "AdamW step" in line
    # FSDP2's warning about the transformer's view output is harmless here (parallel/fsdp.py says why): not shown.
    assert "returned a view tensor" not in out.stderr and "Warning" not in out.stderr, out.stderr
    for term in ("master weights", "gradients", "AdamW moments"):
        assert re.search(rf"{term} [\d.]+ GiB = plan", line), line


def test_lora_shards_the_frozen_base_with_the_adapters_and_trains_the_adapters_only():
    """rl_5b_cps with rank-32 adapters: 600 adapter parameters beside the 825 of the base, every one sharded as the
    layout says; gradients and AdamW moments exactly the plan's adapter-only terms (tens of MB, not GiB), the
    checkpoint plan without the frozen base."""
    out = run("--configfile", "config/recipes/rl_5b_cps.yaml", "--set", "train.lora_rank=32", "--ranks", "127")
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = rank_lines(out.stdout).values()
    assert "1425 parameters" in line and "master weights 2.37 GiB = plan" in line, line
    for term in ("gradients", "AdamW moments"):
        assert re.search(rf"{term} [\d.]+ MB = plan", line), line
    assert "AdamW step" in line and line.endswith(": ok"), line


@pytest.mark.parametrize(
    ("recipe", "nodes", "message"),
    [
        (
            "rl_5b_cps",
            25,
            "world size 200 (= nodes 25 x procs_per_node 8) must divide or be a multiple of the prompts per wave",
        ),
        ("rl_a14b_rule", 4, "grpo.prompts_per_step = 16: must equal train.batch_size 4 x 16 data replicas"),
    ],
)
def test_a_recipe_scaled_wrongly_is_refused_with_preflights_message(recipe, nodes, message):
    out = run("--configfile", f"config/recipes/{recipe}.yaml", "--set", f"parallel.nodes={nodes}")
    assert out.returncode == 3 and message in out.stderr, out.stderr
    config = subprocess.run(
        [VIDEOGRPO, "config", "--configfile", f"config/recipes/{recipe}.yaml", "--set", f"parallel.nodes={nodes}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert config.returncode == 3 and message in config.stderr  # the check every stage and preflight run


def test_ranks_outside_the_world_are_refused():
    out = run("--configfile", "config/recipes/rl_5b_cps.yaml", "--ranks", "128", "--no-steps")
    assert out.returncode == 2 and "the world size is 128 (ranks 0 to 127)" in out.stderr


@pytest.mark.parametrize(
    ("data_parallel", "world", "group", "tp", "rank", "expected"),
    [
        ("hsdp", 128, 8, 1, 127, shard_layout.RankLayout(8, 7)),
        ("hsdp", 128, 8, 1, 9, shard_layout.RankLayout(8, 1)),
        ("fsdp", 8, 4, 2, 7, shard_layout.RankLayout(4, 3, 2, 1)),
        ("fsdp", 8, 4, 2, 2, shard_layout.RankLayout(4, 1, 2, 0)),
        ("replicate", 4, 8, 1, 3, shard_layout.RankLayout(1, 0)),
    ],
)
def test_rank_layouts_follow_the_meshes_row_major_order(data_parallel, world, group, tp, rank, expected):
    assert shard_layout.rank_layout(data_parallel, world, group, tp, rank) == expected


def test_fsdp_rows_are_torch_chunks():
    import torch

    for rows in (0, 1, 5, 8, 13, 3072):
        for degree in (1, 2, 4, 8, 16):
            chunks = torch.chunk(torch.empty(rows, device="meta"), degree) if rows else []
            for shard in range(degree):
                held = chunks[shard].shape[0] if shard < len(chunks) else 0
                padded = chunks[0].shape[0] if chunks else 0
                assert shard_layout.fsdp_rows(rows, degree, shard) == (padded, held), (rows, degree, shard)


def test_an_unsharded_layout_is_simulated_too():
    """The tiny default replicates its transformer on 2 ranks: its parameters are not FSDP's, and the steps must
    still reach the gradients and AdamW state torch allocates for them."""
    out = run("--configfile", "config/config.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = rank_lines(out.stdout)
    assert sorted(lines) == [0, 1]
    for line in lines.values():
        for term in ("master weights", "gradients", "AdamW moments"):
            assert re.search(rf"{term} [\d.]+ KB = plan", line), line


def test_the_5b_recipe_on_one_node_shards_over_its_8_ranks():
    """Fewer ranks than the 32 prompts of a wave: each of 8 ranks serves 4 prompts (tests/test_prompts_per_rank.py)
    and shards the transformer 8 ways."""
    out = run("--configfile", "config/recipes/rl_5b_cps.yaml", "--set", "parallel.nodes=1", "--no-steps")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = rank_lines(out.stdout)
    assert list(lines) == [0, 7] and "world 8 (1 nodes x 8), hsdp in groups of 8" in out.stdout
    for rank, line in lines.items():
        assert f"fsdp {rank}/8" in line and "master weights 2.33 GiB = plan" in line and line.endswith(": ok"), line
