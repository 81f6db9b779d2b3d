"""Several rewards (reward.terms): the tiny trainer in this process scoring each rollout with the stand-in EvalKit and
the judge stand-in (demo.stand_in_judge, real HTTP), the advantage taken from the weighted sum, each term logged and
failing as its own fail_on_error says; the config rules; every runtime decision (workflow DAG, preflight, the
per-node judge service, the memory plan, verify's pins) seeing both terms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from demo import copy_checkout, jobs_run, run

from videogrpo.demo.stand_in_judge import JudgeServer

from conftest import PROTOCOL_FILE, REPO, RUBRIC_FILE
from harness import metrics, solo_config, trainer_in_process

WEIGHTS = {"vbvr_rule": 0.7, "vbvr_vlm": 0.3}


def terms_config(server: JudgeServer, updates: int = 2, **reward) -> dict:
    """The solo tiny trainer with both terms, the judge the stand-in at `server`."""
    cfg = solo_config(train={"max_steps": updates, "save_steps": 1})
    cfg["reward"].update(
        terms=dict(WEIGHTS),
        judge_endpoint=server.endpoint,
        judge_prompts=str(RUBRIC_FILE),
        judge_protocol=str(PROTOCOL_FILE),
        judge_max_retries=0,
        **reward,
    )
    return cfg


def recording(trainer) -> tuple[list, list]:
    """Each update's (prepared batch, the scorer's results per chunk) and what `_advantages` returned."""
    scored, gathered = [], []
    collect, advantages = trainer.scorer.collect, trainer._advantages

    def record_collect(futures):
        results = collect(futures)
        scored[-1].append(results)
        return results

    def record_advantages(prepared):
        scored.append([])
        out = advantages(prepared)
        gathered.append((prepared, out))
        return out

    trainer.scorer.collect, trainer._advantages = record_collect, record_advantages
    return scored, gathered


def term_table(prepared, per_chunk: list[list[dict]], shape) -> dict[str, torch.Tensor]:
    """Each term's raw scores as the (prompt, member) table the trainer builds from the weighted sums."""
    tables = {kind: torch.full(shape, float("nan"), dtype=torch.float64) for kind in WEIGHTS}
    for chunk, results in zip(prepared.chunks, per_chunk):
        for j, g, result in zip(chunk.prompts, chunk.members, results):
            for kind in WEIGHTS:
                tables[kind][j, g] = result["terms"][kind]
    return tables


def test_the_advantage_is_taken_from_the_weighted_sum_and_each_term_is_logged(tiny_model, dataset, tmp_path):
    from videogrpo.grpo.advantages import group_advantages
    from videogrpo.rewards.terms import WeightedScorer

    with JudgeServer() as server:
        trainer = trainer_in_process(terms_config(server), tmp_path, tiny_model, dataset)
        assert isinstance(trainer.scorer, WeightedScorer)
        scored, gathered = recording(trainer)
        trainer.run()
        assert server.counts == {"answered": 8}  # every rollout of both updates was judged
    rows = metrics(tmp_path)
    assert len(rows) == len(gathered) == 2
    for row, per_chunk, (prepared, out) in zip(rows, scored, gathered):
        terms = term_table(prepared, per_chunk, out["rewards"].shape)
        # The sum in float64, as the scorer adds Python floats, then the trainer's float32 table: exactly its values.
        weighted = sum(WEIGHTS[kind] * table for kind, table in terms.items()).float()
        assert torch.equal(out["rewards"], weighted)
        assert torch.equal(out["advantages"], group_advantages(weighted))
        for chunk in prepared.chunks:  # what the loss was weighted by
            assert torch.equal(
                chunk.advantages, torch.stack([out["advantages"][j, g] for j, g in zip(chunk.prompts, chunk.members)])
            )
        for kind, table in terms.items():
            assert row[f"reward/{kind}"] == pytest.approx(table.mean().item(), abs=1e-6)
            assert not torch.allclose(group_advantages(table.float()), out["advantages"])  # no term alone decides
        expected = sum(WEIGHTS[kind] * row[f"reward/{kind}"] for kind in WEIGHTS)
        assert row["reward_mean"] == pytest.approx(expected, abs=1e-6)
        assert row["reward_errors"] == 0
    assert [row["reward/vbvr_rule"] for row in rows] != [row["reward/vbvr_vlm"] for row in rows]


def broken_evalkit(cfg: dict, tmp_path: Path) -> None:
    """Every evaluator of a copy of the stand-in EvalKit raises, caught by the EvalKit (scored 0, its error set)."""
    from videogrpo.provenance.digest import evalkit_source_digest

    kit = Path(shutil.copytree(Path(cfg["evalkit"]["path"]), tmp_path / "kit"))
    entry = kit / "run_evaluation.py"
    head = "    try:\n        evaluator = TASK_EVALUATOR_MAP[task_name]"
    entry.write_text(entry.read_text().replace(head, "    try:\n        raise KeyError('meta_px')\n" + head[9:]))
    cfg["evalkit"].update(path=str(kit), digest=evalkit_source_digest(kit))


@pytest.mark.parametrize("fail_on_error", [False, True])
@pytest.mark.parametrize("failing", ["vbvr_rule", "vbvr_vlm"])
def test_a_failing_term_follows_its_own_fail_on_error(tiny_model, dataset, tmp_path, failing, fail_on_error):
    """The judge answering 400 (no retry) or every evaluator raising: under that term's fail_on_error the run
    stops naming the term; otherwise the term scores its error score (the judge's 0.2, the EvalKit's 0 for an
    error it reports) and each rollout counts once in reward_errors, while the other term scores as usual."""
    from videogrpo.errors import VideoGRPOError

    with JudgeServer(mode="400" if failing == "vbvr_vlm" else "good") as server:
        cfg = terms_config(server, updates=1, judge_error_score=0.2, judge_fail_on_error=False)
        cfg["evalkit"]["fail_on_error"] = False
        if failing == "vbvr_rule":
            broken_evalkit(cfg, tmp_path)
            cfg["evalkit"]["fail_on_error"] = fail_on_error
        else:
            cfg["reward"]["judge_fail_on_error"] = fail_on_error
        trainer = trainer_in_process(cfg, tmp_path / "run", tiny_model, dataset)
        if fail_on_error:
            said = "the EvalKit evaluator of task" if failing == "vbvr_rule" else "the judge could not score task"
            with pytest.raises(
                VideoGRPOError, match=rf"^reward term {failing} \(weight {WEIGHTS[failing]:g} in reward.terms\): {said}"
            ):
                trainer.run()
            return
        trainer.run()
    (row,) = metrics(tmp_path / "run")
    assert row["reward_errors"] == 4  # the group's four rollouts, each once
    assert row[f"reward/{failing}"] == pytest.approx(0.2 if failing == "vbvr_vlm" else 0.0)
    (other,) = set(WEIGHTS) - {failing}
    assert row[f"reward/{other}"] > 0.0
    expected = sum(WEIGHTS[kind] * row[f"reward/{kind}"] for kind in WEIGHTS)
    assert row["reward_mean"] == pytest.approx(expected, abs=1e-6)


# ---- the config --------------------------------------------------------------------------------------------------


def config_with(**reward):
    from videogrpo import config

    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["reward"].update(reward)
    return config.from_dict(cfg)


def test_the_kinds_in_use_are_the_terms_or_reward_kind_alone():
    from videogrpo.config import kinds_in, reward_kinds

    assert reward_kinds(config_with()) == ("vbvr_rule",)
    assert reward_kinds(config_with(kind="vbvr_vlm")) == ("vbvr_vlm",)
    assert reward_kinds(config_with(terms={"vbvr_vlm": 0.3, "vbvr_rule": 0.7})) == ("vbvr_rule", "vbvr_vlm")
    assert kinds_in("vbvr_rule", {"vbvr_vlm": 1.0}) == ("vbvr_vlm",) and kinds_in("vbvr_vlm", None) == ("vbvr_vlm",)


BOTH_TERMS_NO_RUBRICS = {"terms": dict(WEIGHTS), "judge_prompts": ""}
NOT_AMONG = r"reward.kind = 'vbvr_rule' is not among reward.terms \(vbvr_vlm\): .* set reward.kind to one of the terms"


@pytest.mark.parametrize(
    "reward,message",
    [
        ({"terms": {"vbvr_rule": 0.5, "clip": 0.5}}, "reward.terms.clip: unknown reward kind 'clip'; the kinds are"),
        ({"terms": {"vbvr_rule": 1.0, "vbvr_vlm": 0.0}}, "reward.terms.vbvr_vlm = 0.0: .* finite and non-zero"),
        ({"terms": {"vbvr_rule": float("nan")}}, "reward.terms.vbvr_rule = nan: a term's weight must be finite"),
        ({"terms": {"vbvr_rule": float("inf")}}, "reward.terms.vbvr_rule = inf: a term's weight must be finite"),
        ({"terms": {"vbvr_vlm": 1.0}}, NOT_AMONG),
        (
            {"terms": {"vbvr_rule": 1.0, "vbvr_vlm": -1.0}},
            r"reward.terms = .*: the weights sum to 0, so a rollout that every reward scores alike .* non-zero sum",
        ),
        (BOTH_TERMS_NO_RUBRICS, "reward.judge_prompts = '', .* the vbvr_vlm reward needs its rubric source"),
    ],
)
def test_the_terms_are_checked_naming_the_field(reward, message):
    from videogrpo.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        config_with(**reward)


def test_a_negative_weight_is_a_penalty_and_kind_may_be_either_term():
    assert config_with(terms={"vbvr_rule": 1.0, "vbvr_vlm": -0.5}).reward.terms["vbvr_vlm"] == -0.5
    assert config_with(kind="vbvr_vlm", terms={"vbvr_rule": 1.0, "vbvr_vlm": 0.5}).reward.kind == "vbvr_vlm"


def test_terms_change_the_run_identity_and_empty_terms_do_not():
    from videogrpo.config import run_identity

    text = (REPO / "config/tasks/synthetic.txt").read_text()
    plain = run_identity(config_with(), text)
    assert run_identity(config_with(terms={}), text) == plain
    mixed = run_identity(config_with(terms=dict(WEIGHTS)), text)
    assert mixed != plain != run_identity(config_with(terms={"vbvr_rule": 0.6, "vbvr_vlm": 0.4}), text) != mixed


# ---- each term's runtime ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("terms,judged", [({}, False), (WEIGHTS, True), ({"vbvr_vlm": 1.0}, True)])
def test_the_judge_runtime_is_planned_when_a_term_is_the_judge(terms, judged):
    """reward.kind is vbvr_rule throughout (its default; {vbvr_vlm: 1.0} sets it to the one term): a judge term
    co-hosts the judge on CUDA, takes its share of each GPU in the memory plan and lengthens the rendezvous."""
    from videogrpo.preflight.memory_plan import judge_share
    from videogrpo.rewards.judge_service import co_hosted, rendezvous_join_timeout, training_memory_fraction

    kind = "vbvr_vlm" if terms == {"vbvr_vlm": 1.0} else "vbvr_rule"
    cfg = config_with(kind=kind, terms=dict(terms), judge_gpu_memory=0.25)
    cfg.parallel.device = "cuda"
    assert co_hosted(cfg) is judged
    assert judge_share(cfg) == (0.25 if judged else 0.0)
    assert training_memory_fraction(cfg) == (0.75 if judged else None)
    assert rendezvous_join_timeout(cfg) == (cfg.reward.judge_ready_timeout_s + 600.0 if judged else None)


def test_the_node_waits_for_the_judge_of_a_terms_run(tmp_path):
    from videogrpo.rewards.judge_service import judge_service

    with JudgeServer() as server:
        with judge_service(
            config_with(terms=dict(WEIGHTS), judge_endpoint=server.endpoint), None, tmp_path / "j.log"
        ) as at:
            assert at == server.endpoint
        with judge_service(config_with(judge_endpoint=server.endpoint), None, tmp_path / "j.log") as at:
            assert at == ""  # the rule reward alone: no judge


def test_preflight_checks_both_terms(dataset, tmp_path):
    from videogrpo.preflight.checks import reward_checks
    from videogrpo.provenance.digest import evalkit_source_digest

    cfg = config_with(terms=dict(WEIGHTS), judge_prompts=str(RUBRIC_FILE), judge_protocol=str(PROTOCOL_FILE))
    cfg.evalkit.path = str(REPO / cfg.evalkit.path)
    fingerprint = tmp_path / "fingerprint.json"
    fingerprint.write_text(json.dumps({"source_sha256": evalkit_source_digest(cfg.evalkit.path)}))
    checks = reward_checks(cfg, fingerprint, dataset)
    assert [c.name for c in checks] == ["evalkit_digest", "evalkit_tasks", "judge_rubrics"]
    assert all(c.ok for c in checks), checks
    cfg.reward.terms = {}
    assert [c.name for c in reward_checks(cfg, fingerprint, dataset)] == ["evalkit_digest", "evalkit_tasks"]


def test_verify_checks_the_judge_files_of_a_terms_run(tmp_path):
    from videogrpo.provenance.pins import judge_problems

    rubric = tmp_path / "eval_prompts.py"
    rubric.write_text("EVAL_PROMPTS = {}\n")
    reward = {"kind": "vbvr_rule", "judge_prompts": str(rubric), "judge_prompts_digest": "0" * 64}
    manifests = {tmp_path / "m.json": {"stage": "train", "params": {"reward": reward}}}
    assert judge_problems(manifests) == (0, [])  # the rule reward alone never read it
    reward["terms"] = dict(WEIGHTS)
    checked, problems = judge_problems(manifests)
    assert checked == 1 and problems[0].startswith(f"CHANGED {rubric} (reward.judge_prompts_digest)")


def test_the_dag_of_a_terms_run_holds_both_runtimes_stages(tmp_path):
    """A dry run of the training target: the EvalKit's fingerprint and runtime check and the judge's download; the
    training command hands over the judge model, and the stage scores with the checkout its config names (no part of
    the command: a moved copy reruns nothing)."""
    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / "terms.yaml").write_text(yaml.safe_dump({"reward": {"terms": dict(WEIGHTS)}}))
    out = run(["snakemake", "-n", "-p", "train", "--configfile", "terms.yaml"], checkout)
    text = out.stdout + out.stderr
    assert {"fetch_judge", "fingerprint_evalkit", "check_scorer_runtime", "preflight", "train"} <= set(jobs_run(text))
    command = text.split("videogrpo stage train")[1].split("\n\n")[0]
    assert "--evalkit " not in command and "--judge-model " in command
    from videogrpo.stages.train import evalkit_checkout

    terms = config_with(terms=dict(WEIGHTS))
    assert evalkit_checkout(terms, None) == Path(terms.evalkit.path) and evalkit_checkout(terms, Path("k")) == Path("k")
    assert evalkit_checkout(config_with(kind="vbvr_vlm"), None) is None
    assert "--evalkit-fingerprint" in text.split("videogrpo stage preflight")[1].split("\n\n")[0]


def test_the_report_names_the_terms_and_their_weights():
    from videogrpo.provenance.report_page import recipe_summary

    assert "reward 0.7 x vbvr_rule + 0.3 x vbvr_vlm;" in recipe_summary(
        {"reward": {"kind": "vbvr_rule", "terms": WEIGHTS}}, 2
    )
    assert "reward vbvr_vlm;" in recipe_summary({"reward": {"kind": "vbvr_vlm", "terms": {}}}, 2)
