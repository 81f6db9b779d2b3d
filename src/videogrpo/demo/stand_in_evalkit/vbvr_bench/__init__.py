"""Reference VBVR-style benchmark: task evaluators for the synthetic tasks."""
