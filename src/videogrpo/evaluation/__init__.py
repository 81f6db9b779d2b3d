"""The evaluation path: the evaluation set pinned and checked (`evalset`), videos generated per (model, sampler) cell
(`generate`, `sampling`), prepared and scored with the EvalKit (`score`), aggregated per task and domain with
standard errors and bootstrap intervals (`aggregate`), and Hub pipelines validated before they are evaluated
(`pipelines`). The held-out check of a run (`heldout`) still has a path of its own.

May import: `grpo` (its rollout and samplers), `rewards`, `models`, `data`, `artifacts`, `provenance`, `config` and
the core modules.
"""
