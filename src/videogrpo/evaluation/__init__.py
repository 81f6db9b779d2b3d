"""The one evaluation path: a run's evaluation set, an external tree pinned or one built from the dataset's split,
and its exact set checked (`evalset`), videos generated per (model, sampler) cell (`generate`, `sampling`),
prepared and scored with the EvalKit (`score`), aggregated per task, domain and overall with standard errors,
bootstrap intervals and paired changes from the base model (`aggregate`), and Hub pipelines validated before they
are evaluated (`pipelines`). The held-out check of a run is two of its cells (config/cells.py). Several runs'
evaluations and training side by side, paired sample by sample (`comparison`, `videogrpo compare`).

May import: `grpo` (its rollout and samplers), `rewards`, `models`, `data`, `artifacts`, `provenance`, `config` and
the core modules.
"""
