"""Rewards: the rule reward over a pinned EvalKit checkout, its fingerprints, and the reference EvalKit."""

from pathlib import Path

REFERENCE_EVALKIT = Path(__file__).parent / "reference_evalkit"
