"""The whole run's batch arithmetic at the released recipes' real counts, from the functions the trainer calls
(no process, no model): which (sample, group member) rows every rank rolls out in each epoch, what ranks and
tensor-parallel peers draw for them, and the replay plan's update count (docs/reference-system.md#grpo).

The trainer's path: `Trainer.__init__` orders `load_split(dataset, "rl")` with `training_order`, plans the run with
`run_plan`, takes its rows from `waves` and scores them only where `Experts.tp_rank` is 0; `prepare(batch)` reads
the batch's prompts with `batch_for_step`, a row (j, g) rolling out prompt j of the batch as member g; a row's
noise and eta are keyed by `assignment`'s keys, and the rank's torch seed is `assignment.replica_seed`.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import torch

from videogrpo import config
from videogrpo.data.dataset import batch_for_step, load_split, steps_per_epoch, training_order
from videogrpo.data.materialize import split
from videogrpo.grpo import assignment
from videogrpo.grpo.assignment import waves
from videogrpo.grpo.draws import counter_seed, seeded_normal, seeded_uniform
from videogrpo.grpo.experts import Experts, mesh_dims
from videogrpo.grpo.replay import total_updates
from videogrpo.grpo.trainer import run_plan

# The released topologies: (recipe, parallel.nodes), None for the recipe's own; the VLM recipe runs on 4, 8 or 16
# nodes of 8 ranks. And the 5B rule recipe on 1 and 2 nodes, a rank serving 4 or 2 prompts of each wave.
TOPOLOGIES = [
    ("rl_5b_cps", None),
    ("rl_5b_cps", 1),
    ("rl_5b_cps", 2),
    ("rl_5b_sde", None),
    ("rl_5b_vlm", 4),
    ("rl_5b_vlm", 8),
    ("rl_5b_vlm", 16),
    ("rl_a14b_rule", None),
]
IDS = [f"{recipe}-{nodes or 'recipe'}" for recipe, nodes in TOPOLOGIES]
# The update counts docs/reference-system.md states for a full run (#one-step-delayed-replay, #a14b).
REFERENCE_UPDATES = {"rl_5b_cps": 7728, "rl_5b_sde": 7728, "rl_5b_vlm": 7728, "rl_a14b_rule": 15625}


def load(repo, monkeypatch, recipe: str, nodes: int | None) -> config.Config:
    monkeypatch.chdir(repo)
    overrides = {"parallel": {"nodes": nodes}} if nodes else None
    return config.load(["config/config.yaml", f"config/recipes/{recipe}.yaml"], overrides)


@pytest.fixture(scope="module")
def training_split(repo, tmp_path_factory):
    """The `rl` split of a data section as `load_split` reads it from a materialized dataset's manifest: the real
    tasks and per-task counts (50 x 1,000), task-grouped, without sample files (nothing here reads a prompt)."""
    made = {}

    def make(data) -> list:
        key = (data.task_list, data.samples_per_task, data.heldout_per_task, data.shuffle_seed, data.split_name)
        if key not in made:
            root = tmp_path_factory.mktemp("dataset")
            tasks = config.read_task_list(repo / data.task_list)
            index = {task: [f"{task}_{i:05d}" for i in range(data.samples_per_task)] for task in tasks}
            manifest = [
                {"task": task, "source": task, "split": data.split_name, **ids}
                for task, ids in split(index, data.heldout_per_task, data.shuffle_seed).items()
            ]
            (root / "dataset.json").write_text(json.dumps({"root": "raw"}))
            (root / "splits.json").write_text(json.dumps(manifest))
            made[key] = load_split(root, "rl")
        return made[key]

    return make


def rank_rows(cfg: config.Config) -> tuple[Experts, dict[int, list[list[tuple[int, int]]]]]:
    """Each rank's waves of (prompt, member) rows, and the run's TP arithmetic (an Experts holding no module)."""
    world = cfg.world_size
    return Experts([], False, mesh_dims(cfg, world)), {rank: waves(cfg, rank, world) for rank in range(world)}


@pytest.mark.parametrize("recipe,nodes", TOPOLOGIES, ids=IDS)
def test_each_epoch_rolls_out_every_prepared_sample_once_per_group_member(
    repo, monkeypatch, training_split, recipe, nodes
):
    """Per epoch: every sample of a rolled-out batch is rolled out once for each of its G members by the ranks
    that score, and nothing else is; what is left out is exactly the batches a delayed-replay flush skips and the
    partial batch at the epoch's end (none in the synchronous A14B recipe: there every sample, every epoch)."""
    cfg = load(repo, monkeypatch, recipe, nodes)
    prompts, group = cfg.grpo.prompts_per_step, cfg.grpo.group_size
    train = training_split(cfg.data)
    assert len(train) == 50_000
    order = training_order(train, cfg.data.shuffle_seed)
    position = {id(sample): i for i, sample in enumerate(train)}  # a sample's index in the task-grouped split
    experts, rows = rank_rows(cfg)

    # The rows whose rewards fill the group table (Trainer.scores: a TP peer's rows are its tp_rank 0's).
    scoring = [rank for rank in rows if experts.tp_rank(rank) == 0]
    assert len(scoring) == experts.replicas(cfg.world_size)
    flat = [(rank, j, g) for rank in scoring for wave in rows[rank] for j, g in wave]
    ranks, slots, members = (np.array(column) for column in zip(*flat))
    # Every replica does the same share: the group's G members of each prompt spread evenly over its ranks.
    assert set(np.bincount(ranks, minlength=cfg.world_size)[scoring]) == {prompts * group // len(scoring)}
    assert set(slots) == set(range(prompts)) and set(members) == set(range(group))

    never = set(range(len(train)))  # samples left out of every epoch so far
    rolled, skipped = defaultdict(list), defaultdict(list)
    for action in run_plan(cfg, len(order)):
        epoch, batch = batch_for_step(order, prompts, action.batch)
        (rolled if action.prepare else skipped)[epoch].append([position[id(sample)] for sample in batch])
    assert sorted(rolled) == list(range(cfg.train.epochs))
    per_epoch = steps_per_epoch(len(order), prompts)
    remainder = len(order) - per_epoch * prompts
    for epoch in range(cfg.train.epochs):
        batches = np.array(rolled[epoch])  # [rolled-out batches, prompts]: sample positions
        samples = batches[:, slots]  # [batches, rows]: the sample of every scoring row of every batch
        counts = np.bincount((samples * group + members).ravel(), minlength=len(train) * group)
        counts = counts.reshape(len(train), group)
        assert counts.max() == 1, f"epoch {epoch}: a (sample, member) rolled out twice"
        per_sample = counts.sum(axis=1)
        assert set(np.unique(per_sample)) <= {0, group}, f"epoch {epoch}: a group rolled out in part"
        assert (per_sample == group).sum() == prompts * len(batches)
        left_out = set(np.flatnonzero(per_sample == 0).tolist())
        skipped_samples = {i for batch in skipped[epoch] for i in batch}
        # The partial batch dropped at an epoch's end is the training order's tail.
        tail = {position[id(sample)] for sample in order[len(order) - remainder :]}
        assert len(tail) == remainder and left_out == skipped_samples | tail
        assert len(batches) + len(skipped[epoch]) == per_epoch
        if not cfg.grpo.delayed_replay:
            assert not left_out, f"epoch {epoch}: {len(left_out)} samples never rolled out"
        never &= left_out
    if cfg.grpo.delayed_replay:
        # The order is shuffled once and every epoch's last batch is a flush with a full slot at these counts: the
        # same batch and the tail are left out of every epoch (docs/reference-system.md#one-step-delayed-replay).
        _, last_batch = batch_for_step(order, prompts, per_epoch - 1)
        assert never == {position[id(sample)] for sample in last_batch} | tail


@pytest.mark.parametrize("recipe,nodes", TOPOLOGIES, ids=IDS)
def test_tp_peers_draw_alike_and_every_row_draws_its_own_noise(repo, monkeypatch, training_split, recipe, nodes):
    """TP peers roll out the same prompts with the same x_T, step noise and eta, and seed torch alike; apart from
    that, within a batch every (prompt, member, step) draws its own noise, a group shares x_T (the recipes) and
    eta, and the same prompt position of another batch (another epoch included) draws afresh."""
    cfg = load(repo, monkeypatch, recipe, nodes)
    seed, shared, steps = cfg.train.seed, cfg.grpo.share_group_noise, cfg.grpo.sampling_steps
    prompts, group = cfg.grpo.prompts_per_step, cfg.grpo.group_size
    experts, rows = rank_rows(cfg)
    tp = cfg.parallel.tensor_parallel
    peers = defaultdict(list)
    for rank in rows:
        peers[experts.mesh_dims.dp_rank(rank) if experts.mesh_dims else rank].append(rank)
    assert all(len(ranks) == tp for ranks in peers.values())

    def draws(rank: int, batch: int) -> list:
        return [
            (
                assignment.init_noise_key(seed, batch, j, g, shared),
                assignment.eta_key(seed, batch, j),
                tuple(assignment.step_noise_key(seed, batch, j, g, i) for i in range(steps)),
            )
            for wave in rows[rank]
            for j, g in wave
        ]

    order = training_order(training_split(cfg.data), cfg.data.shuffle_seed)
    in_order = {id(sample): i for i, sample in enumerate(order)}
    per_epoch = steps_per_epoch(len(order), prompts)
    last = per_epoch * cfg.train.epochs - 1
    for batch in (0, per_epoch - 1, per_epoch, last):  # both ends of the first epoch, the second's first, the last
        _, batch_prompts = batch_for_step(order, prompts, batch)
        for replica, ranks in peers.items():
            if not cfg.grpo.shared_prompts:  # the reference's strided sampler: positions k P + r + {0, R, 2R, ...}
                taken = sorted({in_order[id(batch_prompts[j])] for wave in rows[ranks[0]] for j, _ in wave})
                first = (batch % per_epoch) * prompts + replica
                assert taken == list(range(first, first + prompts, len(peers))), f"replica {replica}, batch {batch}"
            assert [experts.tp_rank(rank) for rank in ranks] == list(range(tp)), f"replica {replica}"
            assert len({assignment.replica_seed(seed, rank, tp) for rank in ranks}) == 1
            assert all(rows[rank] == rows[ranks[0]] for rank in ranks), f"TP peers {ranks} roll out different rows"
            assert all(draws(rank, batch) == draws(ranks[0], batch) for rank in ranks), f"TP peers {ranks} draw apart"
        everyone = [d for ranks in peers.values() for d in draws(ranks[0], batch)]
        assert len({step for *_, per_step in everyone for step in per_step}) == prompts * group * steps
        assert len({init for init, *_ in everyone}) == (prompts if shared else prompts * group)
        assert len({eta for _, eta, _ in everyone}) == prompts
    assert len({assignment.replica_seed(seed, ranks[0], tp) for ranks in peers.values()}) == len(peers)

    # Keys that differ make different draws, and equal keys equal ones, wherever they are drawn: a replica's first
    # row as each TP peer draws it, in batch 0 and in the same position one epoch later.
    cpu = torch.device("cpu")
    for ranks in peers.values():
        j, g = rows[ranks[0]][0][0]
        for batch in (0, per_epoch):
            x_t = [seeded_normal((2, 3), cpu, *assignment.init_noise_key(seed, batch, j, g, shared)) for _ in ranks]
            assert all(torch.equal(x, x_t[0]) for x in x_t)
            if cfg.grpo.eta_range:
                lo, hi = cfg.grpo.eta_range
                assert len({seeded_uniform(lo, hi, *assignment.eta_key(seed, batch, j)) for _ in ranks}) == 1
        assert counter_seed(*assignment.init_noise_key(seed, 0, j, g, shared)) != counter_seed(
            *assignment.init_noise_key(seed, per_epoch, j, g, shared)
        )


@pytest.mark.parametrize("recipe,nodes", TOPOLOGIES, ids=IDS)
def test_the_full_length_plan_makes_the_reference_update_count(repo, monkeypatch, training_split, recipe, nodes):
    """The trainer's plan at full length against a closed form (docs/reference-system.md#one-step-delayed-replay)
    and the reference's figure: 7,728 updates for the 5B recipes (delayed replay), 15,625 for A14B (synchronous)."""
    cfg = load(repo, monkeypatch, recipe, nodes)
    epochs, save = cfg.train.epochs, cfg.train.save_steps
    assert cfg.train.max_steps is None
    per_epoch = steps_per_epoch(len(training_split(cfg.data)), cfg.grpo.prompts_per_step)
    actions = run_plan(cfg, len(training_split(cfg.data)))
    assert len(actions) == epochs * per_epoch
    if cfg.grpo.delayed_replay:
        # Flushes cut each epoch into stretches that start with an empty slot: a prefill (rolled out, no update),
        # one update per batch after it, and a flush that replays the slot and skips its own batch. So updates =
        # batches - stretches, the stretches being one per epoch plus one per save_steps multiple:
        # U = E x B - E - floor(U / S), the one U with U + floor(U / S) = E (B - 1) (the sum grows strictly with U).
        solutions = [u for u in range(epochs * per_epoch) if u + (u // save if save else 0) == epochs * (per_epoch - 1)]
        assert len(solutions) == 1
        expected = solutions[0]
        # The closed form's premises: no save flush falls on an epoch's last batch (it would end one stretch, not
        # two), and no stretch is a single synchronous batch.
        assert sum(action.flush for action in actions) == epochs + (expected // save if save else 0)
        assert not any(action.replay == action.batch for action in actions)
    else:
        expected = epochs * per_epoch
    assert total_updates(actions) == expected == REFERENCE_UPDATES[recipe]
    # Every rolled-out batch is replayed in exactly one update: no rollout is wasted, none replayed twice.
    rolled_out = [action.batch for action in actions if action.prepare]
    assert sorted(action.replay for action in actions if action.update) == rolled_out
