"""Rubrics of the synthetic tasks for the VLM judge, in the layout of the reference's prompt source.

Like the real one (an external module, pinned by the SHA-256 of this file in reward.judge_prompts_digest),
it defines EVAL_PROMPTS: task name -> rubric text asking for the judge's fixed answer lines.
"""

_ANSWER = (
    "Answer with exactly these lines and nothing else:\n"
    "goal_score: <0-100>\nquality_score: <0-100>\ngoal_weight: <0-100>\nquality_weight: <0-100>\n"
    "total_score: <0-100>\nreason: <1-2 sentences>\n"
    "The weights must sum to 100."
)

EVAL_PROMPTS = {
    "S-1_move_red_square_data-generator": (
        "The first image is the starting frame; the video is the model's continuation. Aspects: goal (the red "
        "square ends inside the cell outlined in green) and quality (the square keeps its shape and colour).\n"
        + _ANSWER
    ),
    "S-2_fill_circle_blue_data-generator": (
        "The first image is the starting frame; the video is the model's continuation. Aspects: goal (the "
        "outlined circle ends filled with blue) and quality (the outline and background stay intact).\n" + _ANSWER
    ),
    "S-3_grow_bar_to_line_data-generator": (
        "The first image is the starting frame; the video is the model's continuation. Aspects: goal (the green "
        "bar ends reaching the dashed red line) and quality (the bar grows smoothly, nothing else changes).\n" + _ANSWER
    ),
}
