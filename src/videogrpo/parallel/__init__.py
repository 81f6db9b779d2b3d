"""Parallelism of the trainable transformers: process groups from torchrun's environment and the few collectives the
trainer uses (`process_groups`), replication, FSDP2 and HSDP (`fsdp`), tensor parallel and TP x FSDP over a
("dp", "tp") mesh (`tensor_parallel`), and which rank holds which shard of each parameter (`shard_layout`, torch-free:
the memory plan counts with it). The same code runs on CPU (gloo) and GPU (NCCL).

May import: `models`, `config`, `provenance` and the core modules.
"""
