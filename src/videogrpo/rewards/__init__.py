"""Rewards: the rule reward over a pinned EvalKit checkout (`evalkit`: its source digest and runtime contract;
`rule`, `scorer_process`, `request`, `scoring`: the scorer pool and what each sample is scored from), and the VLM
judge (`judge_protocol`: the request and answer validation; `judge`: the client; `judge_service`: the per-node
vLLM service); several of them at once, their weighted sum the reward (`terms`, reward.terms). Each reward submits now
and collects later.

May import: `data`, `provenance`, `config` and the core modules.
"""


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
