"""One module per workflow rule: `rule fetch_model` runs `videogrpo fetch-model`, defined in `stages/fetch_model.py`.

Each module has `add_arguments(parser)` and `run(args) -> int`; the logic lives in the concern packages, which a
stage may import, as may the workflow helpers (`pipeline`); nothing below imports a stage. The code a stage runs is
found from its module's imports (provenance/code.py), never listed by hand. Beside them, what every stage's log
needs: `log_reserve` (room for the last line on a full disk) and `log_tee` (the training log's tee).
"""

STAGES = (
    "fetch_model",
    "fetch_judge",
    "fetch_refiner",
    "fetch_kernel",
    "fetch_dataset",
    "materialize_dataset",
    "validate_dataset",
    "fingerprint_evalkit",
    "check_scorer_runtime",
    "preflight",
    "train",
    "eval_set",
    "fetch_eval_model",
    "generate_cell",
    "score_cell",
    "matrix",
    "report",
)
