"""Provenance: file and tree digests (`digest`), the code identity of a stage or of the trainer's math (`code`), stage
manifests and the input checks of a stage (`manifest`), the interconnect variables a training manifest records
(`interconnect`), what a stage cost and the run's trace (`cost`, `trace`), `videogrpo verify` and `diff`
(`verify`, `pins`), the rows of metrics.jsonl (`metric_rows`), and the run's report page and RO-Crate
(`report_page`, `cost_page`, `crate`).

May import: `config` and the core modules (`errors`, `atomic`, `progress`).
"""
