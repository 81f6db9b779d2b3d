"""Task name -> evaluator. Each evaluator maps (generated final frame, ground truth) to dimensions in [0, 1]."""

from vbvr_bench.evaluators.synthetic import fill_circle_blue, grow_bar_to_line, move_red_square

TASK_EVALUATOR_MAP = {
    "S-1_move_red_square_data-generator": move_red_square,
    "S-2_fill_circle_blue_data-generator": fill_circle_blue,
    "S-3_grow_bar_to_line_data-generator": grow_bar_to_line,
}
