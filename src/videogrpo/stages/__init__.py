"""One module per workflow rule: `rule fetch_model` runs `videogrpo fetch-model`, defined in `stages/fetch_model.py`.

Each module has `add_arguments(parser)` and `run(args) -> int`; the logic lives in the concern modules.
"""

STAGES = (
    "fetch_model",
    "fetch_judge",
    "fetch_kernel",
    "fetch_dataset",
    "materialize_dataset",
    "validate_dataset",
    "fingerprint_evalkit",
    "check_scorer_runtime",
    "preflight",
    "train",
    "evaluate",
    "synthesize_eval_set",
    "eval_set",
    "fetch_eval_model",
    "generate_cell",
    "score_cell",
    "matrix",
    "report",
)

# Shared plumbing every stage uses; its changes do not rerun stages (their effects show in config
# values or manifests).
SHARED_CODE = (
    "__init__.py",
    "cli.py",
    "config",
    "errors.py",
    "atomic.py",
    "progress.py",
    "provenance/__init__.py",
    "provenance/digest.py",
    "provenance/manifest.py",
    "stages/__init__.py",
    "stages/common.py",
    "data/__init__.py",
    "matrix/__init__.py",
)

# Package code each stage runs, beyond the shared plumbing.
# Its digest is a param of the stage's rule: Snakemake sees a rule's own text, not imported modules.
CODE_PARTS = {
    "fetch_model": ("stages/fetch_model.py", "hub.py", "models/tiny.py"),
    "fetch_judge": ("stages/fetch_judge.py", "hub.py"),
    "fetch_kernel": ("stages/fetch_kernel.py", "hub.py", "attention_kernel.py"),
    "fetch_dataset": ("stages/fetch_dataset.py", "hub.py", "data/synthetic.py", "data/video.py"),
    "materialize_dataset": ("stages/materialize_dataset.py", "data/materialize.py", "data/archive.py"),
    "validate_dataset": (
        "stages/validate_dataset.py",
        "data/validate.py",
        "data/video.py",
        "data/materialize.py",
        "data/archive.py",
    ),
    "fingerprint_evalkit": ("stages/fingerprint_evalkit.py", "rewards/evalkit.py"),
    # The probe runs in a scorer process: the worker module and what it imports to score.
    "check_scorer_runtime": (
        "stages/check_scorer_runtime.py",
        "rewards/evalkit.py",
        "rewards/scorer_process.py",
        "rewards/request.py",
        "rewards/scoring.py",
        "data/video.py",
    ),
    "preflight": (
        "stages/preflight.py",
        "preflight.py",
        "attention_kernel.py",
        "data/video.py",
        "grpo",
        "models",
        "rewards",
        "data/dataset.py",
        "distributed.py",
        "checkpoint.py",
        "parallelize.py",
    ),
    "train": (
        "stages/train.py",
        "launch.py",
        "attention_kernel.py",
        "preflight.py",
        "grpo",
        "models",
        "rewards",
        "data/dataset.py",
        "data/video.py",
        "distributed.py",
        "checkpoint.py",
        "parallelize.py",
    ),
    "evaluate": (
        "stages/evaluate.py",
        "evaluate.py",
        "grpo",
        "models",
        "rewards",
        "data/dataset.py",
        "data/video.py",
        "matrix/aggregate.py",
        "matrix/evalset.py",
    ),
    "synthesize_eval_set": (
        "stages/synthesize_eval_set.py",
        "matrix/evalset.py",
        "matrix/synthetic_tree.py",
        "data/synthetic.py",
        "data/video.py",
    ),
    "eval_set": ("stages/eval_set.py", "matrix/evalset.py", "data/video.py"),
    "fetch_eval_model": ("stages/fetch_eval_model.py", "hub.py", "matrix/models.py", "models"),
    # The two GRPO modules generation runs (not the trainer: its edits never regenerate a matrix).
    "generate_cell": (
        "stages/generate_cell.py",
        "matrix/evalset.py",
        "matrix/generate.py",
        "grpo/__init__.py",
        "grpo/rollout.py",
        "grpo/samplers.py",
        "models",
        "data/video.py",
    ),
    "score_cell": (
        "stages/score_cell.py",
        "matrix/evalset.py",
        "matrix/score.py",
        "matrix/aggregate.py",
        "rewards",
        "data/video.py",
    ),
    "matrix": ("stages/matrix.py", "matrix/aggregate.py", "matrix/evalset.py", "data/video.py"),
    "report": ("stages/report.py", "provenance/report.py", "provenance/crate.py"),
}
