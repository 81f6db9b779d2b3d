"""What the embedded tiny default brings, so that the whole pipeline runs on a laptop with no download: tiny random Wan
TI2V and I2V-A14B pipelines built from configs (`tiny_ti2v`, `tiny_i2v`), a synthetic dataset in the real archive
layout (`synthetic_dataset`), and the stand-ins for the external inputs the recipes pin: an EvalKit checkout
(`stand_in_evalkit/`) and the judge's rubric and protocol files (`stand_in_judge_prompts.py`,
`stand_in_judge_protocol.py`; read as files, never imported by the package), and a judge service that answers
as vLLM does (`python -m videogrpo.demo.stand_in_judge --port 18080`). Nothing of the production path imports this
package; the stages that make the tiny default's inputs do. `synthetic_eval_tree` writes an external evaluation
tree in the release layout, which the tests hand to eval_set as matrix.eval_set (the tiny default builds its
evaluation set from the dataset).

May import: `evaluation`, `data`, `models`, `provenance`, `config` and the core modules.
"""
