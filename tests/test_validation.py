"""Validation during training (train.validate_*): held-out prompts sampled with fixed noise and scored by the training
reward at chosen updates, in a world of one run in this process (tiny model, 2 updates). It leaves training
bit-identical, its scores are the reward of what the policy samples, and a resumed run logs exactly the points of an
uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness import metrics, solo_config, tensors, train_in_process, trainer_in_process, weights

BASE = dict(train={"max_steps": 2, "save_steps": 1, "keep_checkpoints": 3})
ON = {"validate_every": 1, "validate_before_training": True, "validate_prompts": 3}


def options(**sections) -> dict:
    cfg = solo_config(**BASE)
    for section, values in sections.items():
        cfg[section].update(values)
    return cfg


def val_rows(out) -> list[dict]:
    return [m for m in metrics(out) if any(k.startswith("val/") for k in m)]


def train_rows(out) -> list[dict]:
    return [m for m in metrics(out) if not any(k.startswith("val/") for k in m)]


def timeless(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "val/time_s"} for r in rows]


@pytest.fixture(scope="module")
def plain(tiny_model, dataset, tmp_path_factory):
    return train_in_process(options(), tmp_path_factory.mktemp("plain"), tiny_model, dataset)


@pytest.fixture(scope="module")
def validated(tiny_model, dataset, tmp_path_factory):
    return train_in_process(options(train=ON), tmp_path_factory.mktemp("validated"), tiny_model, dataset)


def test_validation_leaves_training_bit_identical(plain, validated):
    assert weights(validated) == weights(plain)
    assert timeless(train_rows(validated)) == timeless(train_rows(plain))
    # Point 0 before the first update; point k right after update k's own row.
    assert [(m["step"], "val/reward_mean" in m) for m in metrics(validated)] == [
        (0, True),
        (1, False),
        (1, True),
        (2, False),
        (2, True),
    ]
    for row in val_rows(validated):
        assert row["val/prompts"] == 3 and row["val/reward_errors"] == 0
        assert set(row["val/reward_per_task"]) and row["val/time_s"] > 0


def test_the_points_are_every_validate_every_updates_and_the_last(tiny_model, dataset, tmp_path):
    from videogrpo import config
    from videogrpo.grpo import validation

    cfg = config.from_dict(options(train={"validate_every": 3}))
    assert [k for k in range(1, 8) if validation.due(cfg, k, 7)] == [3, 6, 7]
    off = config.from_dict(options())
    assert not any(validation.due(off, k, 7) for k in range(1, 8))
    assert validation.before_training(config.from_dict(options(train=ON)), 0)
    assert not validation.before_training(config.from_dict(options(train=ON)), 1)  # a resume has its point 0


def independent_scores(cfg_dict: dict, transformer_dir, tiny_model, dataset, evalkit, eta=None) -> list[float]:
    """The held-out prompts sampled one by one with validation's noise keys (the Euler ODE, or Flow-CPS at `eta`),
    decoded and scored by the stand-in EvalKit: what validation must report, computed without the trainer."""
    from videogrpo import config
    from videogrpo.data.dataset import load_split
    from videogrpo.grpo import assignment, denoise
    from videogrpo.grpo.draws import seeded_normal
    from videogrpo.grpo.samplers import sigma_schedule
    from videogrpo.models.wan import WanTI2V, flow_shift, load_transformer
    from videogrpo.rewards.rule import RuleScorer, score_request

    cfg = config.from_dict(cfg_dict)
    model = WanTI2V.from_config(tiny_model, torch.device("cpu"), cfg)
    transformer = (
        model.transformer
        if transformer_dir is None
        else load_transformer(transformer_dir, model.device, cfg.parallel.attention_backend)
    )
    transformer.eval()
    v = cfg.video
    shape = model.geometry(v.num_frames, v.height, v.width).shape
    shift, _ = flow_shift(cfg, tiny_model)
    held = load_split(dataset, "heldout")[: cfg.train.validate_prompts]
    scorer = RuleScorer.for_config(cfg, evalkit)
    try:
        futures = []
        for i, sample in enumerate(held):
            embeds, condition = model.encode_conditions([sample.prompt], [sample.first_frame], v.height, v.width)
            key = assignment.validation_noise_key(cfg.train.seed, i, assignment.X_T_STEP)
            how = denoise.ODE(denoise.ode_scheduler("euler", tiny_model, shift), cfg.grpo.sampling_steps)
            if eta is not None:
                how = denoise.SDE(
                    "flowcps",
                    sigma_schedule(cfg.grpo.sampling_steps, shift),
                    eta,
                    lambda k, i=i: seeded_normal(
                        shape, model.device, *assignment.validation_noise_key(cfg.train.seed, i, k)
                    )[None],
                )
            latents = denoise.sample_latents(
                model, transformer, embeds, condition, seeded_normal(shape, model.device, *key)[None], how
            )
            video = model.decode(latents)[0]
            futures.append(scorer.submit(score_request(cfg.evalkit, v.fps, video, sample.task, str(sample.directory))))
        return [r["score"] for r in scorer.collect(futures)]
    finally:
        scorer.close()


def test_the_points_are_the_reward_of_the_policys_videos(validated, tiny_model, dataset, evalkit):
    first, _, last = val_rows(validated)
    cfg = options(train=ON)
    before = independent_scores(cfg, None, tiny_model, dataset, evalkit)
    after = independent_scores(cfg, validated / "final/transformer", tiny_model, dataset, evalkit)
    # One forward of all three prompts against one each: float rounding only.
    assert first["val/reward_mean"] == pytest.approx(np.mean(before), abs=1e-4)
    assert first["val/reward_std"] == pytest.approx(np.std(before), abs=1e-4)
    assert last["val/reward_mean"] == pytest.approx(np.mean(after), abs=1e-4)
    assert first["val/reward_mean"] != last["val/reward_mean"]  # the weights moved, and so did the score


def test_an_sde_point_draws_each_prompts_noise_by_its_key(tiny_model, dataset, evalkit, tmp_path):
    """Flow-CPS at eta 0.7: x_T and every step's eps keyed by (seed, prompt, step), whatever the batch holds."""
    from videogrpo.grpo import validation

    cfg = options(train=dict(ON, validate_sampler="flowcps-0.7"))
    trainer = trainer_in_process(cfg, tmp_path, tiny_model, dataset)
    try:
        point = validation.validate(trainer, 0)
    finally:
        trainer.scorer.close()
    alone = independent_scores(cfg, None, tiny_model, dataset, evalkit, eta=0.7)
    assert point["val/reward_mean"] == pytest.approx(np.mean(alone), abs=1e-4)
    assert point["val/reward_std"] == pytest.approx(np.std(alone), abs=1e-4)


def test_a_resumed_run_logs_exactly_the_points_of_an_uninterrupted_one(
    validated, tiny_model, dataset, tmp_path, monkeypatch
):
    """Two crashes: inside update 1 (after point 0 was written, before any checkpoint: a fresh start again), and
    inside point 2 (after update 2's row, before its checkpoint: a resume from update 1)."""
    from videogrpo.grpo import validation

    real_validate = validation.validate

    def crashing_at(where: str, update: int):
        trainer = trainer_in_process(options(train=ON), tmp_path, tiny_model, dataset)
        real = trainer.update if where == "update" else real_validate

        def crash(*args):
            if (args[0].update if where == "update" else args[1]) == update:
                raise KeyboardInterrupt(f"crash in {where} {update}")
            return real(*args)

        with monkeypatch.context() as patch:
            patch.setattr(trainer, "update", crash) if where == "update" else patch.setattr(
                validation, "validate", crash
            )
            with pytest.raises(KeyboardInterrupt):
                trainer.run()

    crashing_at("update", 1)
    assert [m["step"] for m in metrics(tmp_path / "checkpoints")] == [0]
    crashing_at("validate", 2)
    assert [m["step"] for m in metrics(tmp_path / "checkpoints")] == [0, 1, 1, 2]
    trainer_in_process(options(train=ON), tmp_path, tiny_model, dataset).run()
    assert timeless(metrics(tmp_path)) == timeless(metrics(validated))
    assert weights(tmp_path) == weights(validated)


def test_validation_runs_in_eval_mode_on_the_offload_schedule_and_restores_both(tiny_model, dataset, tmp_path):
    from videogrpo.grpo import offload, validation

    trainer = trainer_in_process(options(train=dict(ON, offload_inference_models=True)), tmp_path, tiny_model, dataset)
    try:
        modes = []
        trainer.experts.policy.register_forward_pre_hook(lambda module, args: modes.append(module.training))
        trainer.placement.enter("replay")  # where an update leaves it
        moves = len(trainer.placement.moves)
        rng = torch.get_rng_state()
        row = validation.validate(trainer, 1)
        assert modes and not any(modes)  # every forward in eval mode (the frozen parts' hooks held the schedule)
        assert trainer.experts.policy.training
        assert torch.equal(torch.get_rng_state(), rng)
        assert trainer.placement.phase == "replay"
        assert trainer.placement.where == offload.plan("replay", True)
        phases = [phase for phase, what, _ in trainer.placement.moves[moves:] if what in offload.FROZEN]
        assert phases[:3] == ["encode", "encode", "rollout"] and "decode" not in phases[:1]
        assert row["step"] == 1 and row["val/prompts"] == 3
        assert len(trainer.model._prompt_cache) == 0  # held-out prompts never evict training's
    finally:
        trainer.scorer.close()


def test_prompts_are_spread_evenly_over_the_data_replicas():
    from videogrpo.grpo.validation import replica_share

    for count, replicas in [(5, 2), (3, 4), (8, 4), (1, 1)]:
        shares = [replica_share(count, replicas, r) for r in range(replicas)]
        assert len({len(s) for s in shares}) == 1  # every rank runs the same forwards
        assert sorted(i for s in shares for i in s if i >= 0) == list(range(count))
    assert replica_share(5, 2, 1) == [1, 3, -1]


@pytest.mark.parametrize(
    "train, data, named",
    [
        (
            {"validate_every": 2},
            {"heldout_per_task": 0},
            r"train.validate_every = 2, train.validate_before_training = False: .*data.heldout_per_task is 0; hold "
            r"samples out with data.heldout_per_task >= 1",
        ),
        (
            {"validate_before_training": True},
            {"heldout_per_task": 0},
            r"train.validate_before_training = True: .*data.heldout_per_task is 0",
        ),
        ({"validate_prompts": 0}, {}, r"train.validate_prompts = 0: must be > 0 \(to turn validation off"),
        ({"validate_sampler": "heun"}, {}, r"train.validate_sampler: 'heun' is not a sampler: use unipc, euler"),
        ({"validate_sampler": "flowcps-2"}, {}, r"train.validate_sampler: 'flowcps-2': Flow-CPS noise must be in"),
        ({"validate_every": -1}, {}, r"train.validate_every = -1: must be >= 0"),
    ],
    ids=["every-without-heldout", "before-without-heldout", "no-prompts", "unknown-sampler", "bad-eta", "negative"],
)
def test_the_config_check_refuses_a_validation_it_cannot_run(train, data, named):
    from videogrpo import config
    from videogrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=named):
        config.from_dict(options(train=train, data=data, matrix={"split": "rl"}))
    config.from_dict(options(train=ON))  # the tiny default holds one sample of each task out
    config.from_dict(options(data={"heldout_per_task": 0}, matrix={"split": "rl"}))  # validation off: fine


def test_every_sampler_kind_validates(tiny_model, dataset, tmp_path):
    """An SDE sampler draws its step noise by key: two points of the same weights agree; other samplers differ."""
    from videogrpo.grpo import validation

    found = {}
    for sampler in ("flowcps-0.7", "flowcps-uniform-0.2-0.9", "unipc", "dancegrpo-0.3"):
        trainer = trainer_in_process(
            options(train=dict(ON, validate_sampler=sampler)), tmp_path / sampler, tiny_model, dataset
        )
        try:
            first, second = (validation.validate(trainer, k)["val/reward_mean"] for k in (0, 0))
        finally:
            trainer.scorer.close()
        assert first == second, sampler
        found[sampler] = first
    assert len(set(found.values())) == len(found), found


def test_the_report_draws_the_points_beside_the_training_curve(validated):
    from videogrpo.provenance import report_page

    rows = metrics(validated)
    fig = report_page.reward_curve_figure(rows)
    [ax] = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["mean reward (band: ±1 std)", "validation: mean reward of 3 held-out prompts, fixed noise"]
    training, points = ax.get_lines()
    assert list(training.get_xdata()) == [1, 2]
    assert list(points.get_xdata()) == [0, 1, 2]
    assert list(points.get_ydata()) == [m["val/reward_mean"] for m in val_rows(validated)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels
    assert report_page.reward_curve_png(rows)
    assert tensors(validated)


def test_diff_compares_the_last_update_and_the_last_point(validated, tmp_path):
    from videogrpo.provenance.verify import _final_metrics

    (tmp_path / "train").mkdir()
    (tmp_path / "train/metrics.jsonl").write_text((validated / "metrics.jsonl").read_text())
    found = _final_metrics(tmp_path)
    last_update, last_point = train_rows(validated)[-1], val_rows(validated)[-1]
    assert found["train.step"] == 2 and found["train.reward_mean"] == last_update["reward_mean"]
    assert found["train.val/reward_mean"] == last_point["val/reward_mean"]
    assert "train.val/time_s" not in found


def test_two_fsdp_ranks_share_the_prompts_and_log_what_one_rank_does(validated, tiny_model, dataset, tmp_path):
    """Under torchrun on 2 gloo ranks with FSDP: 3 prompts dealt 2 + (1 and a dropped repeat), every rank in
    lockstep; point 0 (the same initial weights) scores what the one-rank run scored."""
    from harness import train, trainer_config

    cfg = trainer_config(parallel={"data_parallel": "fsdp"}, train=dict(BASE["train"], **ON))
    assert train(cfg, tmp_path, tiny_model, dataset)
    points = val_rows(tmp_path)
    assert [m["step"] for m in points] == [0, 1, 2] and all(m["val/prompts"] == 3 for m in points)
    assert points[0]["val/reward_mean"] == pytest.approx(val_rows(validated)[0]["val/reward_mean"], abs=1e-4)
    assert points[0]["val/reward_per_task"] == pytest.approx(val_rows(validated)[0]["val/reward_per_task"], abs=1e-4)
