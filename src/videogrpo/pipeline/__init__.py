"""What the Snakefile needs from the package: where every output goes (`layout`). Everything here is light (no torch,
no diffusers): the workflow imports it whenever it is read, dry runs included.

May import: `launch`, `demo`, `models` (its torch-free names), `provenance`, `config` and the core modules.
"""
