"""The VLM judge's protocol (docs/reference-system.md#vlm-judge): the pinned rubric and protocol sources, parsed
without running
them, the rubric's output fields, the structured-output regex, and the validation of an answer."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from videogrpo.errors import ConfigError, DigestMismatch
from videogrpo.rewards.judge_protocol import (
    JudgeAnswerError,
    RubricError,
    load_protocol,
    load_rubrics,
    output_fields,
    output_regex,
    validate_answer,
)

from conftest import JUDGE_FIELDS, PROTOCOL_FILE, RUBRIC_FILE

FIELDS = JUDGE_FIELDS
GOOD = "goal_score: 80\nquality_score: 60\ngoal_weight: 70\nquality_weight: 30\ntotal_score: 74\nreason: close."


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


RUBRICS = load_rubrics(RUBRIC_FILE, sha(RUBRIC_FILE))
RUBRIC = RUBRICS["S-1_move_red_square_data-generator"]


# ---- the rubric's output contract --------------------------------------------------------------------------


def test_the_output_fields_come_from_the_rubrics_output_section():
    assert output_fields(RUBRIC) == FIELDS
    assert output_fields(RUBRICS["S-3_grow_bar_to_line_data-generator"])[:3] == [
        "reach_score",
        "smoothness_score",
        "background_score",
    ]
    head = "Rate it.\nsome_score: not a field, before the section\nOutput format (exactly these lines):\n"
    assert output_fields(head + "a_score: <0-100>\na_weight: <0-100>\ntotal_score: <0-100>\nreason: <text>\n") == [
        "a_score",
        "a_weight",
        "total_score",
        "reason",
    ]
    with pytest.raises(RubricError, match="has no 'Output format"):
        output_fields("Rate it.\na_score: <0-100>\ntotal_score: <0-100>\nreason: <text>")
    with pytest.raises(RubricError, match="the last two must be total_score and reason"):
        output_fields(head + "a_score: <0-100>\nreason: <text>\ntotal_score: <0-100>")
    with pytest.raises(RubricError, match=r"\['a_score'\] more than once"):
        output_fields(head + "a_score: <0-100>\na_score: <0-100>\ntotal_score: <0-100>\nreason: <text>")


def test_the_regex_accepts_a_valid_answer():
    regex = output_regex(RUBRIC)
    assert re.fullmatch(regex, GOOD)
    for number in ("0", "7", "42", "99.5", "100", "100.0", "0.25"):
        assert re.fullmatch(regex, GOOD.replace("goal_score: 80", f"goal_score: {number}")), number


@pytest.mark.parametrize(
    "answer",
    [
        GOOD.replace("quality_score: 60\n", ""),  # missing field
        GOOD.replace("quality_score: 60\n", "quality_score: 60\nquality_score: 60\n"),  # repeated field
        GOOD.replace("total_score: 74", "total_score: 101"),  # out of range
        GOOD.replace("total_score: 74", "total_score: 100.5"),
        GOOD.replace("total_score: 74", "total_score: -1"),
        GOOD.replace("goal_score: 80", "goal_score: high"),  # not a number
        GOOD.replace("goal_score: 80", "goal_score: 1e2"),
        GOOD.replace("goal_score: 80", "goal_score: 08"),
        GOOD.replace("goal_score: 80", "goal_score: .5"),
        GOOD.replace("reason: close.", "reason: "),  # empty reason
        GOOD.replace("goal_score: 80\nquality_score: 60", "quality_score: 60\ngoal_score: 80"),  # out of order
        GOOD + "\nextra: 1",
        "```\n" + GOOD + "\n```",
    ],
)
def test_the_regex_rejects_each_kind_of_invalid_answer(answer):
    assert not re.fullmatch(output_regex(RUBRIC), answer)


def test_a_valid_answer_maps_total_score_to_the_unit_interval():
    verdict = validate_answer(GOOD, FIELDS)
    assert verdict.score == 0.74 and verdict.reason == "close."
    assert verdict.values == {
        "goal_score": 80,
        "quality_score": 60,
        "goal_weight": 70,
        "quality_weight": 30,
        "total_score": 74,
    }


@pytest.mark.parametrize("weights,ok", [((70, 29), False), ((70, 29.6), True), ((70, 30.4), True), ((70, 30.6), False)])
def test_the_weights_must_add_up_to_100_within_half_a_point(weights, ok):
    answer = GOOD.replace("goal_weight: 70", f"goal_weight: {weights[0]}")
    answer = answer.replace("quality_weight: 30", f"quality_weight: {weights[1]}")
    if ok:
        assert validate_answer(answer, FIELDS).score == 0.74
    else:
        with pytest.raises(JudgeAnswerError, match=f"add up to {sum(weights):g}, not 100"):
            validate_answer(answer, FIELDS)


@pytest.mark.parametrize(
    "answer,problem",
    [
        (GOOD.replace("quality_score: 60\n", ""), "has no `quality_score:` lines"),
        (GOOD + "\ntotal_score: 74", "has 2 `total_score:` lines"),
        (GOOD.replace("total_score: 74", "total_score: 140"), "`total_score` is 140, outside 0-100"),
        (GOOD.replace("total_score: 74", "total_score: nan"), "`total_score` is nan, outside 0-100"),
        (GOOD.replace("goal_score: 80", "goal_score: high"), "`goal_score` is 'high', not a number"),
        (GOOD.replace("reason: close.", "reason:   "), "the `reason:` line is empty"),
        (GOOD.replace("reason: close.", ""), "has no `reason:` lines"),
        ("The video looks fine.", "has no `goal_score:` lines"),
    ],
)
def test_invalid_answers_are_named(answer, problem):
    with pytest.raises(JudgeAnswerError, match=re.escape(problem)):
        validate_answer(answer, FIELDS)


# ---- the pinned sources ------------------------------------------------------------------------------------


def test_a_protocol_file_with_another_digest_is_refused_naming_both_digests(tmp_path):
    copy = tmp_path / "protocol.py"
    copy.write_text(PROTOCOL_FILE.read_text() + "# edited\n")
    pinned = sha(PROTOCOL_FILE)
    with pytest.raises(DigestMismatch) as err:
        load_protocol(copy, pinned)
    assert f"expected {pinned} (reward.judge_protocol_digest)" in str(err.value)
    assert f"found    {sha(copy)}" in str(err.value)


def test_the_protocol_is_parsed_never_executed(tmp_path):
    ran = tmp_path / "ran"
    source = tmp_path / "protocol.py"
    source.write_text(
        f"import pathlib\npathlib.Path({str(ran)!r}).write_text('imported')\nraise SystemExit('imported')\n"
        "TASK_VLM_JUDGE_OUTPUT_REMINDER = (\n    'Answer in the format. '\n    \"Nothing else.\"\n)\n"
        "TASK_VLM_JUDGE_REPAIR_PROMPT: str = 'Fix it.'\n"
    )
    protocol = load_protocol(source, sha(source))
    assert protocol.reminder == "Answer in the format. Nothing else." and protocol.repair == "Fix it."
    assert not ran.exists()


@pytest.mark.parametrize(
    "text,problem",
    [
        ("TASK_VLM_JUDGE_OUTPUT_REMINDER = 'a'\n", "defines no TASK_VLM_JUDGE_REPAIR_PROMPT"),
        ("TASK_VLM_JUDGE_REPAIR_PROMPT = 'a'\n", "defines no TASK_VLM_JUDGE_OUTPUT_REMINDER"),
        (
            "X = 'a'\nTASK_VLM_JUDGE_OUTPUT_REMINDER = X\nTASK_VLM_JUDGE_REPAIR_PROMPT = 'b'\n",
            "TASK_VLM_JUDGE_OUTPUT_REMINDER is not a plain string literal (found Name",
        ),
        (
            "TASK_VLM_JUDGE_OUTPUT_REMINDER = 'a'\nTASK_VLM_JUDGE_REPAIR_PROMPT = 'b' + 'c'\n",
            "TASK_VLM_JUDGE_REPAIR_PROMPT is not a plain string literal (found BinOp",
        ),
        (
            "TASK_VLM_JUDGE_OUTPUT_REMINDER = f'{1}'\nTASK_VLM_JUDGE_REPAIR_PROMPT = 'b'\n",
            "TASK_VLM_JUDGE_OUTPUT_REMINDER is not a plain string literal (found JoinedStr",
        ),
        (
            "TASK_VLM_JUDGE_OUTPUT_REMINDER = 'a'\nTASK_VLM_JUDGE_REPAIR_PROMPT = 'b'\n" * 2,
            "TASK_VLM_JUDGE_OUTPUT_REMINDER is assigned more than once",
        ),
        ("def broken(:\n", "not a Python module"),
    ],
)
def test_a_protocol_file_without_plain_string_constants_is_refused_naming_file_and_constant(tmp_path, text, problem):
    source = tmp_path / "protocol.py"
    source.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"{source}: {problem}")):
        load_protocol(source, sha(source))


def test_the_rubric_source_is_pinned_parsed_never_executed_and_must_cover_the_tasks(tmp_path):
    ran = tmp_path / "ran"
    rubric = "Rate it.\nOutput format (exactly these lines):\na_score: <0-100>\na_weight: <0-100>\n"
    rubric += "total_score: <0-100>\nreason: <text>\n"
    source = tmp_path / "prompts.py"
    source.write_text(
        f"open({str(ran)!r}, 'w').write('imported')\nEVAL_PROMPTS = {{'T-1_a': {rubric!r}, 'T-2_b': {rubric!r}}}\n"
    )
    pinned = sha(source)
    assert load_rubrics(source, pinned, ["T-1_a"])["T-1_a"] == rubric and not ran.exists()
    with pytest.raises(ConfigError, match=r"no rubric for task\(s\) \['T-9_c'\]; the source covers 2 tasks"):
        load_rubrics(source, pinned, ["T-1_a", "T-9_c"])
    with pytest.raises(DigestMismatch, match="expected .* \\(reward.judge_prompts_digest\\)"):
        load_rubrics(source, "0" * 64)
    broken = tmp_path / "broken.py"
    broken.write_text(f"EVAL_PROMPTS = {{'T-1_a': {rubric!r}, 'T-2_b': 'Rate it.'}}\n")
    with pytest.raises(ConfigError, match=f"{broken}: the rubric of task 'T-2_b' has no 'Output format"):
        load_rubrics(broken, sha(broken))
    computed = tmp_path / "computed.py"
    computed.write_text(f"R = {rubric!r}\nEVAL_PROMPTS = {{'T-1_a': R}}\n")
    with pytest.raises(ConfigError, match="EVAL_PROMPTS is not a dict literal of strings"):
        load_rubrics(computed, sha(computed))


def test_the_recipe_pins_the_references_protocol_and_the_judge_needs_one():
    from videogrpo import config

    root = Path(__file__).parents[1]
    recipe = config.load([root / "config/config.yaml", root / "config/recipes/rl_5b_vlm.yaml"])
    assert recipe.reward.judge_protocol_digest == "54a153ff01d681500f8ffcda5d13cd6c2a0b7e13a3af236d5082f9b30111e7ab"
    assert recipe.reward.judge_fps == 16
    default = config.load([root / "config/config.yaml"])
    assert default.reward.judge_protocol_digest == sha(PROTOCOL_FILE)
    assert default.reward.judge_prompts_digest == sha(RUBRIC_FILE)
    unpinned = {"reward": {"kind": "vbvr_vlm", "judge_protocol_digest": ""}}
    with pytest.raises(ConfigError, match="judge_protocol_digest = '': the vbvr_vlm reward needs its protocol source"):
        config.load([root / "config/config.yaml"], unpinned)
