"""Starting training on machines: a machine's place in the job from SLURM's, the manual contract's or the local
environment, and the torchrun and srun commands and environments built from it (`torchrun`); what each machine does
in each role of the train stage, one function per role (`node`); and multi-node training as one indexed Kubernetes
Job (`k8s_job`).

May import: `preflight`, `grpo`, `rewards`, `artifacts`, `config`, `provenance` and the core modules.
"""
