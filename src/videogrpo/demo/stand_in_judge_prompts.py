"""Rubrics of the synthetic tasks for the VLM judge, in the layout of the reference's prompt source.

Like the real one (an external module, pinned by the SHA-256 of this file in reward.judge_prompts_digest),
it defines EVAL_PROMPTS as a plain literal: task name -> rubric text, whose "Output format (exactly these
lines):" section lists the judge's answer lines (the aspects' scores, their weights, total_score, reason).
"""

EVAL_PROMPTS = {

'S-1_move_red_square_data-generator': """
You are judging a generated video of a move-the-square task.

Task: a red square must slide into the cell outlined in green.

You get the first frame (the input) and the generated video.

Score the following 2 aspects (each 0-100):

1. Goal: the red square ends inside the cell outlined in green.

2. Quality: the square keeps its shape and colour while it moves.

Then decide how much each aspect should count, as percentages that sum to 100.

Output format (exactly these lines):
goal_score: <0-100>
quality_score: <0-100>
goal_weight: <0-100>
quality_weight: <0-100>
total_score: <0-100, your overall score for the video>
reason: <1-2 sentences>
""",

'S-2_fill_circle_blue_data-generator': """
You are judging a generated video of a fill-the-circle task.

Task: the outlined circle must end filled with blue.

You get the first frame (the input) and the generated video.

Score the following 2 aspects (each 0-100):

1. Goal: the outlined circle ends filled with blue.

2. Quality: the outline and the background stay intact.

Then decide how much each aspect should count, as percentages that sum to 100.

Output format (exactly these lines):
goal_score: <0-100>
quality_score: <0-100>
goal_weight: <0-100>
quality_weight: <0-100>
total_score: <0-100, your overall score for the video>
reason: <1-2 sentences>
""",

'S-3_grow_bar_to_line_data-generator': """
You are judging a generated video of a grow-the-bar task.

Task: the green bar must grow until it reaches the dashed red line.

You get the first frame (the input) and the generated video.

Score the following 3 aspects (each 0-100):

1. Reach: the green bar ends touching the dashed red line.

2. Smoothness: the bar grows steadily, without jumps or flicker.

3. Background: nothing but the bar changes.

Then decide how much each aspect should count, as percentages that sum to 100.

Output format (exactly these lines):
reach_score: <0-100>
smoothness_score: <0-100>
background_score: <0-100>
reach_weight: <0-100>
smoothness_weight: <0-100>
background_weight: <0-100>
total_score: <0-100, your overall score for the video>
reason: <1-2 sentences>
""",
}
