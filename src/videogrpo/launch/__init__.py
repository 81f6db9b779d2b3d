"""Starting training on machines: one torchrun per machine from SLURM's, the manual contract's or the local
environment (`torchrun`), and multi-node training as one indexed Kubernetes Job (`k8s_job`).

May import: `preflight`, `grpo`, `rewards`, `artifacts`, `config`, `provenance` and the core modules.
"""
