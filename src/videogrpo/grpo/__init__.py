"""The GRPO trainer on flow-matching samplers: transitions and log-probs (`samplers`), advantages, the PPO loss, prompt
assignment, every random draw by its key (`draws`), the delayed-replay plan, the LR schedule, rollout and replay,
two-expert routing, offload, the trainer (each update's objective per algorithm in `objectives`) and its torchrun
worker; checkpoints and their resume guard (`checkpoint`, `checkpoint_mirror` for object storage), SFT initialisation
(`sft_init`), FLOP counts and the trackers (`tracking` for W&B and metrics.jsonl, `mlflow_run` for MLflow). The options
beyond the reference (docs/options.md): LoRA adapters (`lora`), the optimizer stepping in host memory
(`host_optimizer`), validation during training (`validation`, sampling through `denoise`, the one sampling loop
evaluation uses too), the SDE window (`sde_window`), GRPO-Guard (`loss`), DiffusionNFT (`nft`), several optimizer
updates per rollout batch (`minibatches`, which the updates' replay in `objectives` follows) and the copies kept beside
the trained weights: DiffusionNFT's old policy and the moving average of the weights (`weight_copy`).

May import: `parallel`, `rewards`, `models`, `data`, `artifacts`, `provenance`, `config` and the core modules.
"""
