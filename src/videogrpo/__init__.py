"""videogrpo: GRPO reinforcement learning of Wan2.2 video models as a provenance-first workflow.

The package, by layer (a module imports only from its own layer's package or from layers below; tests/test_layers.py
holds the contract):
- `cli` - the commands a person runs, and the per-rule commands under `videogrpo stage`;
- `stages` - one module per workflow rule: read the config, check inputs, call a concern, write the manifest;
- `pipeline` - what the Snakefile needs: paths, stage params and config files, resources, the start-of-run check;
- `launch`, `demo` - starting training on machines (torchrun, SLURM, Kubernetes); what the tiny default brings;
- `evaluation`, `preflight` - the one evaluation path; what is checked before a GPU hour is spent;
- `grpo` - the trainer: samplers, loss, replay, rollout, checkpoints, SFT initialisation, trackers;
- `parallel`, `rewards` - FSDP/HSDP, tensor parallel, process groups; the rule reward and the VLM judge;
- `models`, `data`, `artifacts` - Wan TI2V and I2V-A14B; archives, materialization, validation, the dataset; Hub
  snapshots, safetensors headers, attention kernels;
- `provenance`, `config` - digests, code identity, manifests, verify/diff, report; typed config and run identity;
- `errors`, `atomic`, `progress` - the error type and exit codes, atomic writes, progress lines.
"""

__version__ = "0.1.0"
