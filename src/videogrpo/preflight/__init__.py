"""What is checked before a model is loaded or a GPU hour is spent: the config-aware checks of the preflight stage
(`checks`), the per-node probe every machine of a training job runs before torchrun (`node`), the per-rank memory
plan (`memory_plan`, over the pipeline's shape: `model_shape`), the Triton compiler's test kernel (`triton_check`), a
recipe checked at its real world size and shapes on torch's fake process group (`simulate`, `videogrpo simulate`),
the layouts a recipe fits in on given GPUs with a modelled time per update (`planner`, `videogrpo plan`) and that
model and plan against the GPU measurements of the reference trainer (`measured`).

May import: `grpo`, `parallel`, `rewards`, `models`, `data`, `artifacts`, `provenance`, `config` and the core modules.
"""
