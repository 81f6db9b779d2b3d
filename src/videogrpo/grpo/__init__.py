"""The GRPO trainer on flow-matching samplers: transitions and log-probs (`samplers`), advantages, the PPO loss, prompt
assignment, the delayed-replay plan, the LR schedule, rollout and replay, two-expert routing, offload, the trainer
and its torchrun worker; checkpoints and their resume guard (`checkpoint`, `checkpoint_mirror` for object storage),
SFT initialisation (`sft_init`), FLOP counts and the trackers (`tracking` for W&B and metrics.jsonl,
`mlflow_run` for MLflow).

May import: `parallel`, `rewards`, `models`, `data`, `artifacts`, `provenance`, `config` and the core modules.
"""
