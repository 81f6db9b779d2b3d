"""GRPO on flow-matching samplers: transitions, advantages, loss, prompt assignment, replay, trainer."""
