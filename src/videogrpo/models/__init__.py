"""Models: the tiny random Wan2.2 TI2V builder and loading a Diffusers pipeline for rollouts and training."""
