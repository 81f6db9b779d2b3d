"""Rewards: the rule reward over a pinned EvalKit checkout, its fingerprints, and the reference EvalKit."""

from pathlib import Path

REFERENCE_EVALKIT = Path(__file__).parent / "reference_evalkit"


class NoScorer:
    """The scorer of a rank that scores nothing (a TP peer: its tp_rank 0 decodes and scores the same rollouts),
    so that it starts no scorer processes or judge client; it collects only empty lists."""

    def submit(self, request):
        raise RuntimeError("this rank does not score (a tensor-parallel peer): its tp_rank 0 does")

    def collect(self, futures: list) -> list[dict]:
        if futures:
            raise RuntimeError("this rank does not score (a tensor-parallel peer): it has no results to collect")
        return []

    def close(self, kill: bool = False) -> None:
        pass
