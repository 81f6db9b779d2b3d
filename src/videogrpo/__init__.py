"""videogrpo: GRPO reinforcement learning of Wan2.2 video models as a provenance-first workflow."""

__version__ = "0.1.0"
