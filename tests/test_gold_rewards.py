"""Gold rewards and the divergence alarm (train.validate_rewards): the alarm's rule on validation points, its state
through a checkpoint, a gold reward's failures, the config rules, and the tiny trainer in this process trained on
the rule reward (the stand-in EvalKit) with the VLM judge (demo.stand_in_judge, real HTTP) scoring its validation
points beside it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from videogrpo import config
from videogrpo.demo.stand_in_judge import JudgeServer
from videogrpo.errors import ConfigError
from videogrpo.grpo import gold_rewards
from videogrpo.grpo.gold_rewards import Point, Watch, divergence

from conftest import PROTOCOL_FILE, REPO, RUBRIC_FILE
from harness import metrics, solo_config, train_in_process, trainer_in_process, weights

TASKS = ["G-1", "G-1", "G-1", "G-2", "G-2", "G-2"]


def point(update: int, train: list, gold: list | None) -> Point:
    return Point(update, TASKS, train, {"vbvr_vlm": gold})


def test_the_alarm_fires_where_the_training_reward_rises_and_a_gold_reward_falls_beyond_its_standard_error():
    then = point(2, [0.5] * 6, [0.6] * 6)
    # The training reward rises; the gold reward falls 0.10 on every prompt but one (paired standard error 0.017).
    now = point(4, [0.6] * 6, [0.5, 0.5, 0.5, 0.5, 0.5, 0.6])
    (overall, g1, g2) = divergence(now, then, sigmas=1.0)
    assert (overall.task, g1.task, g2.task) == (None, "G-1", "G-2") and overall.since == 2
    changes = np.array([-0.1] * 5 + [0.0])
    assert overall.gold_change == pytest.approx(changes.mean()) and overall.prompts == 6
    assert overall.gold_stderr == pytest.approx(changes.std(ddof=1) / 6**0.5)
    assert overall.train_change == pytest.approx(0.1)
    # More sigmas than the fall: G-2 (one prompt unchanged) no longer counts; G-1 fell with no spread, so it does.
    assert [s.task for s in divergence(now, then, sigmas=3.0)] == [None, "G-1"]
    # A minimum change (train.divergence_min_change) above the overall fall leaves G-1's larger one.
    assert [s.task for s in divergence(now, then, sigmas=1.0, min_change=0.09)] == ["G-1"]
    # No alarm while the training reward does not rise, or where the gold reward does not fall.
    assert divergence(point(4, [0.5] * 6, now.gold["vbvr_vlm"]), then, 1.0) == []
    assert divergence(point(4, [0.6] * 6, [0.7] * 6), then, 1.0) == []
    # One task alone can fire it: G-2 falls, G-1 rises as much, so the whole is flat.
    mixed = point(4, [0.6] * 6, [0.7, 0.7, 0.7, 0.5, 0.5, 0.5])
    assert [s.task for s in divergence(mixed, then, 1.0)] == ["G-2"]
    # Prompts a reward could not score at either point are left out; a scope needs two pairs; a failed scorer none.
    gaps = point(4, [0.6] * 6, [0.5, None, None, 0.5, 0.5, 0.5])
    assert [(s.task, s.prompts) for s in divergence(gaps, then, 1.0)] == [(None, 4), ("G-2", 3)]
    assert divergence(point(4, [0.6] * 6, None), then, 1.0) == []


def record(update: int, train: list, gold: list | None) -> dict:
    """A validation point's metrics record as grpo/validation.py writes it with one gold reward."""
    found = {"step": update, "val/reward_scores": train, "val/prompt_tasks": TASKS}
    if gold is None:
        found["val/vbvr_vlm/failed"] = "JudgeError: the judge is down"
    else:
        found["val/vbvr_vlm/reward_scores"] = gold
    return found


def test_the_watch_compares_with_the_point_k_back_keeps_its_first_firing_and_resumes_it():
    """The training reward rises 0.1 a point, the gold falls 0.1 a point, on every prompt; the gold scorer failed at
    point 1. With k = 2: no comparison before point 2; point 2 against 0 fires; 3 against 1 has no gold pair; 4
    against 2 fires again (the alarm's first update stays 2)."""
    watch = Watch(["vbvr_vlm"], points=2, sigmas=1.0)
    rows, said = [], []
    for i in range(4):
        rows.append(record(i, [0.1 * i] * 6, [0.9 - 0.1 * i] * 6 if i != 1 else None))
        said.append(watch.observe(rows[-1]))
    assert [r["val/divergence_alarm"] for r in rows] == [0, 0, 1, 0]
    assert [s["task"] for s in rows[2]["val/divergence"]] == [None, "G-1", "G-2"]
    assert said[2][0].startswith("DIVERGENCE ALARM at update 2: vbvr_vlm fell -0.2000") and said[3] == []
    assert watch.fired_at == 2 and rows[3]["val/divergence_first_update"] == 2
    saved = json.loads(json.dumps(watch.state()))  # as a checkpoint after update 3 holds it
    rows.append(record(4, [0.4] * 6, [0.5] * 6))
    fourth = watch.observe(rows[-1])
    assert rows[-1]["val/divergence_alarm"] == 1 and fourth[0].startswith("divergence at update 4 (the alarm first")
    # A resume from the checkpoint after update 3 redoes point 4 exactly.
    resumed = Watch(["vbvr_vlm"], points=2, sigmas=1.0)
    resumed.restore(saved, upto=3)
    again = record(4, [0.4] * 6, [0.5] * 6)
    assert resumed.observe(again) == fourth and again == rows[-1]
    # Points (and a first firing) after the checkpoint a run resumes from are dropped.
    early = Watch(["vbvr_vlm"], points=2, sigmas=1.0)
    early.restore(watch.state(), upto=1)
    assert [p.update for p in early.history] == [0, 1] and early.fired_at is None


class Results:
    """A scorer at the interface grpo/validation.py drives: `collect` gives these results, or raises."""

    def __init__(self, results=None, raises=None):
        self.results, self.raises = results, raises

    def collect(self, futures):
        if self.raises:
            raise self.raises
        return self.results


def test_a_gold_rewards_failures_are_left_out_and_stop_training_only_when_asked():
    scorers = {
        "vbvr_rule": Results([{"score": 0.5}, {"score": 0.0, "error": "evaluator failed", "sample": "s1"}]),
        "vbvr_vlm": Results(raises=ConnectionError("the judge is down")),
    }
    found = gold_rewards.collect(scorers, {"vbvr_rule": [1, 2], "vbvr_vlm": [1, 2]}, fail=False)
    assert found == {"vbvr_rule": [0.5, None], "vbvr_vlm": "ConnectionError: the judge is down"}
    summary = gold_rewards.summary("val/vbvr_rule/", found["vbvr_rule"], ["G-1", "G-2"])
    assert summary["val/vbvr_rule/reward_mean"] == 0.5 and summary["val/vbvr_rule/reward_errors"] == 1
    assert summary["val/vbvr_rule/reward_per_task"] == {"G-1": 0.5}  # not a 0 for the failed sample
    with pytest.raises(gold_rewards.GoldRewardFailed, match="gold reward vbvr_rule .* could not score s1"):
        gold_rewards.collect({"vbvr_rule": scorers["vbvr_rule"]}, {"vbvr_rule": [1, 2]}, fail=True)
    with pytest.raises(gold_rewards.GoldRewardFailed, match="gold reward vbvr_vlm .*the judge is down"):
        gold_rewards.collect({"vbvr_vlm": scorers["vbvr_vlm"]}, {"vbvr_vlm": [1, 2]}, fail=True)


def test_the_config_refuses_a_gold_reward_it_cannot_use():
    def refused(train: dict, reward: dict | None = None) -> str:
        with pytest.raises(ConfigError) as err:
            config.from_dict({"train": train, "reward": reward or {}, "data": {"heldout_per_task": 1}}, partial=True)
        return str(err.value)

    on = {"validate_every": 1, "validate_prompts": 4}
    assert "vbvr_rule is a training reward" in refused(dict(on, validate_rewards=["vbvr_rule"]))
    assert "vbvr_vlm is a training reward" in refused(
        dict(on, validate_rewards=["vbvr_vlm"]), {"kind": "vbvr_rule", "terms": {"vbvr_rule": 1.0, "vbvr_vlm": 0.5}}
    )
    assert "unknown reward kind 'hps'" in refused(dict(on, validate_rewards=["hps"]))
    assert "this run validates never" in refused({"validate_rewards": ["vbvr_vlm"]})
    assert "needs 2 or more" in refused(dict(on, validate_rewards=["vbvr_vlm"], validate_prompts=1))
    assert "train.divergence_points = 0" in refused(dict(on, validate_rewards=["vbvr_vlm"], divergence_points=0))
    assert "train.divergence_min_change = -0.1" in refused(
        dict(on, validate_rewards=["vbvr_vlm"], divergence_min_change=-0.1)
    )
    assert "not among train.validate_rewards" in refused(
        dict(on, validate_rewards=["vbvr_vlm"], keep_best_by="vbvr_rule")
    )
    assert "the divergence alarm watches gold rewards" in refused(dict(on, stop_on_divergence=True))
    assert "writes none before its end" in refused(
        dict(on, validate_rewards=["vbvr_vlm"], stop_on_divergence=True, save_steps=0)
    )


def gold_config(server: JudgeServer, **train) -> dict:
    """The solo tiny trainer on the rule reward, validating the 3 held-out prompts before training and after each of its
    2 updates, the judge stand-in at `server` as its gold reward."""
    cfg = solo_config(
        train={"max_steps": 2, "save_steps": 1, "keep_checkpoints": 3, "validate_every": 1,
               "validate_before_training": True, "validate_prompts": 3, "validate_rewards": ["vbvr_vlm"], **train},
    )  # fmt: skip
    cfg["reward"].update(
        judge_endpoint=server.endpoint,
        judge_prompts=str(RUBRIC_FILE),
        judge_protocol=str(PROTOCOL_FILE),
        judge_max_retries=0,
    )
    return cfg


def test_a_run_on_the_rule_reward_logs_the_judge_as_gold_and_trains_as_without_it(
    tiny_model, dataset, tmp_path_factory, capfd
):
    with JudgeServer() as server:
        cfg = gold_config(server)
        gold = train_in_process(cfg, tmp_path_factory.mktemp("gold"), tiny_model, dataset)
        assert server.counts == {"answered": 3 * 3}  # the validation points' videos, never a rollout's
    said = capfd.readouterr().err
    plain_cfg = json.loads(json.dumps(cfg))
    plain_cfg["train"]["validate_rewards"] = []
    plain = train_in_process(plain_cfg, tmp_path_factory.mktemp("plain"), tiny_model, dataset)
    assert weights(gold) == weights(plain)  # scored by a reward the policy never trains on
    points = [m for m in metrics(gold) if "val/reward_mean" in m]
    assert [m["step"] for m in points] == [0, 1, 2]
    for m in points:
        assert 0 <= m["val/vbvr_vlm/reward_mean"] <= 1 and m["val/vbvr_vlm/reward_errors"] == 0
        assert len(m["val/vbvr_vlm/reward_scores"]) == len(m["val/reward_scores"]) == 3
        assert set(m["val/vbvr_vlm/reward_per_task"]) == set(m["val/reward_per_task"])
        assert m["val/divergence_alarm"] in (0, 1) and "val/divergence" in m
    assert said.count("| vbvr_vlm ") == 3, said[-3000:]
    # The training reward's own numbers are those of the run without gold rewards.
    plain_points = [m for m in metrics(plain) if "val/reward_mean" in m]
    assert [m["val/reward_mean"] for m in points] == [m["val/reward_mean"] for m in plain_points]
    state = json.loads((gold / "checkpoints/step-00000002/state.json").read_text())
    assert [p["update"] for p in state["divergence_watch"]["history"]] == [0, 1, 2]


def test_best_holds_the_weights_of_the_point_the_gold_reward_scored_best(tiny_model, dataset, tmp_path, monkeypatch):
    """train.keep_best_by: best/ is the weights at the point with the highest gold mean (captured here at each point,
    independently of the snapshots), best.json says which and how; snapshots no checkpoint names are gone."""
    from safetensors.torch import load_file

    from videogrpo.grpo import validation

    captured, real = {}, validation.validate

    def capture(trainer, update):
        captured[update] = {k: v.clone() for k, v in trainer.experts.full_state_dicts()["transformer"].items()}
        return real(trainer, update)

    monkeypatch.setattr(validation, "validate", capture)
    with JudgeServer() as server:
        out = train_in_process(gold_config(server, keep_best_by="vbvr_vlm", max_steps=3, keep_checkpoints=1), tmp_path,
                               tiny_model, dataset)  # fmt: skip
    points = [m for m in metrics(out) if "val/reward_mean" in m]
    scores = [m["val/vbvr_vlm/reward_mean"] for m in points]
    chosen = points[scores.index(max(scores))]["step"]  # the first of equal scores
    best = json.loads((out / "best/best.json").read_text())
    assert (best["update"], best["score"], best["reward"]) == (chosen, max(scores), "vbvr_vlm")
    assert "highest val/vbvr_vlm/reward_mean of the run's 4 validation points" in best["chosen_by"]
    assert [m["val/best_update"] for m in points] == [
        points[scores.index(max(scores[: i + 1]))]["step"] for i in range(len(points))
    ]
    kept = load_file(out / "best/transformer/diffusion_pytorch_model.safetensors")
    assert kept.keys() == captured[chosen].keys()
    assert all(torch.equal(kept[k], captured[chosen][k]) for k in kept)
    assert chosen == 3 or not all(torch.equal(kept[k], captured[3][k]) for k in kept)  # not simply the last
    assert [p.name for p in (out / "checkpoints").glob("best-*")] == [f"best-{chosen:08d}"]


def test_a_resumed_run_keeps_the_alarms_points(tiny_model, dataset, tmp_path_factory, monkeypatch):
    """A crash inside point 2 (after update 2's row, before its checkpoint): the resumed run from update 1 has the
    alarm's points 0 and 1 from the checkpoint and logs point 2 exactly as the uninterrupted run; the best point's
    choice and weights are the uninterrupted run's."""
    from videogrpo.grpo import validation

    with JudgeServer() as server:
        keep = {"keep_best_by": "vbvr_vlm"}
        whole = train_in_process(gold_config(server, **keep), tmp_path_factory.mktemp("whole"), tiny_model, dataset)
        out = tmp_path_factory.mktemp("crashed")
        trainer = trainer_in_process(gold_config(server, **keep), out, tiny_model, dataset)
        real = validation.validate

        def crash(trainer, update):
            if update == 2:
                raise KeyboardInterrupt("crash in point 2")
            return real(trainer, update)

        with monkeypatch.context() as patch:
            patch.setattr(validation, "validate", crash)
            with pytest.raises(KeyboardInterrupt):
                trainer.run()
        resumed = trainer_in_process(gold_config(server, **keep), out, tiny_model, dataset)
        assert [p.update for p in resumed.watch.history] == []  # restored when the run starts
        resumed.run()
        assert [p.update for p in resumed.watch.history] == [0, 1, 2]

    def timeless(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "val/time_s"} for r in rows]

    assert timeless(metrics(out)) == timeless(metrics(whole))
    assert (out / "best/best.json").read_text() == (whole / "best/best.json").read_text()
    best = "best/transformer/diffusion_pytorch_model.safetensors"
    assert (out / best).read_bytes() == (whole / best).read_bytes()


# ---- the gold rewards' runtimes ----------------------------------------------------------------------------------


def demo_config(reward: dict | None = None, **train):
    """config/config.yaml (the demo) with held-out prompts validated before training, and `train` on top."""
    import yaml

    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["train"].update(validate_before_training=True, validate_prompts=2, **train)
    cfg["reward"].update(reward or {})
    return config.from_dict(cfg)


def test_every_runtime_decision_sees_the_gold_rewards(dataset, tmp_path):
    """A gold reward is a reward the run scores with: its kind is in reward_kinds (the workflow's stages, preflight,
    verify's pins and the node's judge service read it), not among the rewards the policy trains on."""
    from videogrpo.config import reward_kinds, training_reward_kinds
    from videogrpo.preflight.checks import reward_checks
    from videogrpo.provenance.digest import evalkit_source_digest
    from videogrpo.provenance.pins import judge_problems
    from videogrpo.rewards.judge_service import co_hosted

    gold = demo_config(validate_rewards=["vbvr_vlm"])
    assert reward_kinds(gold) == ("vbvr_rule", "vbvr_vlm") and training_reward_kinds(gold) == ("vbvr_rule",)
    judged = demo_config({"kind": "vbvr_vlm"}, validate_rewards=["vbvr_rule"])
    assert reward_kinds(judged) == ("vbvr_vlm", "vbvr_rule") and training_reward_kinds(judged) == ("vbvr_vlm",)
    gold.parallel.device = "cuda"
    assert co_hosted(gold)  # the node starts the judge for the gold reward alone
    gold.reward.judge_prompts, gold.reward.judge_protocol = str(RUBRIC_FILE), str(PROTOCOL_FILE)
    gold.evalkit.path = str(REPO / gold.evalkit.path)
    fingerprint = tmp_path / "fingerprint.json"
    fingerprint.write_text(json.dumps({"source_sha256": evalkit_source_digest(gold.evalkit.path)}))
    checks = reward_checks(gold, fingerprint, dataset)
    assert [c.name for c in checks] == ["evalkit_digest", "evalkit_tasks", "judge_rubrics"]
    rubric = tmp_path / "eval_prompts.py"
    rubric.write_text("EVAL_PROMPTS = {}\n")
    reward = {"kind": "vbvr_rule", "judge_prompts": str(rubric), "judge_prompts_digest": "0" * 64}
    manifests = {tmp_path / "m.json": {"stage": "train", "params": {"reward": reward, "train": {}}}}
    assert judge_problems(manifests) == (0, [])
    manifests[tmp_path / "m.json"]["params"]["train"]["validate_rewards"] = ["vbvr_vlm"]
    assert judge_problems(manifests)[0] == 1  # verify checks the judge files the gold reward read


@pytest.mark.parametrize(
    ("overrides", "stages"),
    [
        ({"train": {"validate_rewards": ["vbvr_vlm"]}}, {"fetch_judge", "fingerprint_evalkit"}),
        ({"reward": {"kind": "vbvr_vlm"}, "train": {"validate_rewards": ["vbvr_rule"]}}, {"fingerprint_evalkit"}),
    ],
    ids=["judge gold", "rule gold"],
)
def test_the_dag_holds_the_stages_a_gold_reward_needs(tmp_path, overrides, stages):
    import yaml
    from demo import copy_checkout, jobs_run, run

    checkout = copy_checkout(tmp_path / "checkout")
    on = {"data": {"heldout_per_task": 1}, "train": {"validate_before_training": True, "validate_prompts": 2}}
    for section, values in overrides.items():
        on.setdefault(section, {}).update(values)
    (checkout / "gold.yaml").write_text(yaml.safe_dump(on))
    out = run(["snakemake", "-n", "train", "--configfile", "gold.yaml"], checkout)
    assert stages | {"preflight", "train"} <= set(jobs_run(out.stdout + out.stderr))


def test_the_workflow_declares_best_and_the_matrix_can_evaluate_it(tmp_path):
    """With train.keep_best_by the train rule declares best/ beside final/, and matrix.models' `best` is a row whose
    cells sample with best/'s transformer, checked against train's manifest; without it, `best` is refused."""
    import yaml
    from demo import copy_checkout, run

    checkout = copy_checkout(tmp_path / "checkout")
    on = {
        "data": {"heldout_per_task": 1},
        "train": {"validate_before_training": True, "validate_prompts": 2, "validate_rewards": ["vbvr_vlm"],
                  "keep_best_by": "vbvr_vlm"},
        "matrix": {"models": ["best"], "samplers": ["euler"]},
    }  # fmt: skip
    (checkout / "best.yaml").write_text(yaml.safe_dump(on))
    out = run(["snakemake", "-n", "-p", "matrix", "--configfile", "best.yaml"], checkout)
    commands = [line for line in (out.stdout + out.stderr).splitlines() if "videogrpo stage " in line]
    (train,) = [line for line in commands if "videogrpo stage train " in line]
    assert "/train/final" in train
    (cell,) = [line for line in commands if "stage generate-cell" in line and "-best/euler" in line]
    assert "/train/best/transformer" in cell and "train.manifest.json" in cell
    with pytest.raises(ConfigError, match="matrix.models lists 'best'"):
        config.from_dict({"matrix": {"models": ["best"]}, "train": {}}, partial=True)


def test_stop_on_divergence_ends_training_at_the_next_checkpoint_and_a_rerun_goes_no_further(
    tiny_model, dataset, tmp_path, monkeypatch, capfd
):
    """The alarm (its rule made to fire at point 3 here; the rule itself is tested above) stops a run of 6 updates
    with checkpoints every 2 after update 4, exporting those weights; run again, it resumes there and trains no
    further; with train.resume_past_divergence it trains on to its end."""
    from videogrpo.grpo.gold_rewards import Signal

    def fires_at_3(now, then, *thresholds):
        return [Signal("vbvr_vlm", None, then.update, 0.1, -0.1, 0.01, 3)] if now.update == 3 else []

    monkeypatch.setattr(gold_rewards, "divergence", fires_at_3)
    with JudgeServer() as server:
        cfg = gold_config(server, max_steps=6, save_steps=2, stop_on_divergence=True)
        out = train_in_process(cfg, tmp_path, tiny_model, dataset)
        state = json.loads((out / "final/training_state.json").read_text())
        assert state["updates"] == 4 and state["stopped_by_divergence_alarm"] == {"fired_at": 3, "of_updates": 6}
        rows = metrics(out)
        assert [m["step"] for m in rows if "reward_mean" in m] == [1, 2, 3, 4]
        assert [(m["step"], m["val/divergence_alarm"]) for m in rows if "val/reward_mean" in m] == [
            (0, 0), (1, 0), (2, 0), (3, 1), (4, 0)
        ]  # fmt: skip
        said = capfd.readouterr().err
        assert "DIVERGENCE ALARM at update 3" in said and "stopping after update 4 of 6" in said
        stopped = weights(out)
        # Rerun (Snakemake removes a failed or forced stage's outputs first): resumed at 4, nothing more trained.
        (out / "metrics.jsonl").unlink()
        train_in_process(cfg, tmp_path, tiny_model, dataset)
        assert weights(out) == stopped and "stopping after update 4 of 6" in capfd.readouterr().err
        assert [m["step"] for m in metrics(out) if "reward_mean" in m] == [1, 2, 3, 4]
        # Asked to, it trains past the alarm to its end.
        cfg["train"]["resume_past_divergence"] = True
        train_in_process(cfg, tmp_path, tiny_model, dataset)
        state = json.loads((out / "final/training_state.json").read_text())
        assert state["updates"] == 6 and "stopped_by_divergence_alarm" not in state
        assert [m["step"] for m in metrics(out) if "reward_mean" in m] == [1, 2, 3, 4, 5, 6]


def test_the_report_says_whether_the_alarm_fired_and_draws_both_rewards():
    """Points as the trainer records them (gold_rewards.summary and Watch.observe): the training reward rises on
    both tasks, the gold falls in G-2 only. The first screen names the alarm's first point, the reward and the task;
    the figure has both series with their bands, the alarm and best/; the panels start with the diverging task."""
    from videogrpo.provenance import gold_page, report_page

    tasks = ["G-1", "G-1", "G-1", "G-2", "G-2", "G-2"]
    watch, points = Watch(["vbvr_vlm"], points=1, sigmas=1.0, best_by="vbvr_vlm"), []
    for update, (up, down) in enumerate([(0.0, 0.0), (0.1, 0.0), (0.2, 0.1), (0.3, 0.2)]):
        record = {"step": update, "val/prompts": 6, "val/prompt_tasks": tasks}
        record.update(gold_rewards.summary("val/", [0.3 + up + 0.01 * i for i in range(6)], tasks))
        gold = [0.6 + 0.01 * i - (down if t == "G-2" else 0.0) for i, t in enumerate(tasks)]
        record.update(gold_rewards.summary("val/vbvr_vlm/", gold, tasks))
        watch.observe(record)
        points.append(record)
    assert [p["val/divergence_alarm"] for p in points] == [0, 0, 1, 1]
    screen = gold_page.first_screen(points)
    assert "Divergence alarm fired</b> at update 2 (at 2 of 4 validation points)" in screen
    assert "vbvr_vlm fell -0.1000 (task G-2" in screen and "best/ holds the weights after update 0" in screen
    quiet = gold_page.first_screen(points[:2])
    assert "did not fire over 2 validation points" in quiet
    fig = gold_page.curves_figure(points, report_page._pyplot(), report_page._updates_axis)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines if not line.get_label().startswith("_")] == [
        "training reward (band: 95 %)", "gold: vbvr_vlm (band: 95 %)", "divergence alarm", "best/ (keep_best_by)"
    ]  # fmt: skip
    assert [list(line.get_xdata()) for line in lines if line.get_color() == "red"] == [[2, 2], [3, 3]]
    assert [(task, kind) for task, kind, _ in gold_page.diverging_tasks(points)] == [("G-2", "vbvr_vlm"),
                                                                                     ("G-1", "vbvr_vlm")]  # fmt: skip
    page = report_page.render_html(
        {"run_id": "r", "git": {}, "generated_at": "now", "digests": {}, "versions": {}, "config": {}}, points, []
    )
    assert page.index("Divergence alarm fired") < page.index("Reward during training")  # on the first screen
    assert "Gold rewards and the divergence alarm" in page and page.count("data:image/png;base64,") >= 3


def alarm_points(points: list[dict], kinds: list[str], back: int, sigmas: float) -> list[int]:
    """The documented rule, computed here from the logged per-prompt scores: the updates where, against the point
    `back` points earlier, the training reward's mean rose and a gold reward's fell by more than `sigmas` standard
    errors of its paired change, over all prompts or within a task."""
    fired = []
    for now, then in zip(points[back:], points):
        tasks = now["val/prompt_tasks"]
        for scope in [None, *sorted(set(tasks))]:
            rows = [i for i, t in enumerate(tasks) if scope in (None, t)]
            rose = np.mean([now["val/reward_scores"][i] - then["val/reward_scores"][i] for i in rows]) > 0
            for kind in kinds:
                key = f"val/{kind}/reward_scores"
                change = np.array([now[key][i] - then[key][i] for i in rows])
                if rose and len(change) > 1 and -change.mean() > sigmas * change.std(ddof=1) / len(change) ** 0.5:
                    fired.append(now["step"])
    return sorted(set(fired))


def test_a_reward_built_to_be_gamed_fires_the_alarm_where_its_rule_says_and_best_keeps_earlier_weights(
    tiny_model, dataset, tmp_path, monkeypatch
):
    """Training on a judge that pays the last frame's brightness (demo.stand_in_judge, pays="brightness"), with
    the rule reward (the stand-in EvalKit: fidelity to the ground truth's final frame) as gold: over 18 updates the
    training reward rises on the held-out prompts and the gold reward falls. The alarm fires exactly where its rule,
    computed here from the logged scores, says; best/ holds the weights of the best gold point, an earlier one."""
    from safetensors.torch import load_file

    from videogrpo.grpo import validation

    captured, real = {}, validation.validate

    def capture(trainer, update):
        captured[update] = {k: v.clone() for k, v in trainer.experts.full_state_dicts()["transformer"].items()}
        return real(trainer, update)

    monkeypatch.setattr(validation, "validate", capture)
    with JudgeServer(pays="brightness") as server:
        cfg = solo_config(
            train={"max_steps": 18, "epochs": 3, "save_steps": 6, "validate_every": 3, "validate_before_training": True,
                   "validate_prompts": 3, "validate_rewards": ["vbvr_rule"], "keep_best_by": "vbvr_rule", "lr": 5e-3},
            grpo={"clip_range": 0.2, "group_size": 8},
        )  # fmt: skip
        cfg["reward"].update(kind="vbvr_vlm", judge_endpoint=server.endpoint, judge_prompts=str(RUBRIC_FILE),
                             judge_protocol=str(PROTOCOL_FILE), judge_max_retries=0)  # fmt: skip
        out = train_in_process(cfg, tmp_path, tiny_model, dataset)
    points = [m for m in metrics(out) if "val/reward_mean" in m]
    trained = [p["val/reward_mean"] for p in points]
    gold = [p["val/vbvr_rule/reward_mean"] for p in points]
    assert trained[-1] > trained[0] and gold[-1] < gold[0], (trained, gold)  # the training reward is gamed
    expected = alarm_points(points, ["vbvr_rule"], back=2, sigmas=1.0)
    assert expected, (trained, gold)
    assert [p["step"] for p in points if p["val/divergence_alarm"]] == expected
    assert {p["val/divergence_first_update"] for p in points if p["step"] >= expected[0]} == {expected[0]}
    best = json.loads((out / "best/best.json").read_text())
    assert best["update"] == points[gold.index(max(gold))]["step"] < points[-1]["step"]
    kept = load_file(out / "best/transformer/diffusion_pytorch_model.safetensors")
    assert all(torch.equal(kept[k], captured[best["update"]][k]) for k in kept)


def test_two_fsdp_ranks_score_each_prompt_once_by_the_gold_reward(tiny_model, dataset, tmp_path):
    """Under torchrun on 2 gloo ranks with FSDP, 3 prompts dealt 2 + (1 and a dropped repeat): the judge scores each
    prompt's video once per point (the repeat never), and every rank's gathered numbers are whole."""
    from harness import train, trainer_config

    with JudgeServer() as server:
        cfg = trainer_config(parallel={"data_parallel": "fsdp"}, train=gold_config(server)["train"])
        cfg["reward"].update(gold_config(server)["reward"])
        assert train(cfg, tmp_path, tiny_model, dataset)
        assert server.counts == {"answered": 3 * 3}
    points = [m for m in metrics(tmp_path) if "val/reward_mean" in m]
    assert [m["step"] for m in points] == [0, 1, 2]
    for m in points:
        assert len(m["val/vbvr_vlm/reward_scores"]) == 3 and None not in m["val/vbvr_vlm/reward_scores"]
    assert not (tmp_path / "best").exists()  # keep_best_by off: final/ only
