"""What the Snakefile needs from the package: where every output goes (`layout`), what each rule hands its stage
(`stage_config`: params and config files), the cluster resources of each kind of job (`resources`), and what a run
does once when it starts (`start`: the invocation record, the config files, the one check of the inputs at risk,
`start_check`). Everything here is light (no torch, no diffusers): the workflow imports it whenever it is read,
dry runs included, and reading it writes nothing.

May import: `launch`, `demo`, `models` (its torch-free names), `provenance`, `config` and the core modules.
"""
