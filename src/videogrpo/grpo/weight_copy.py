"""Copies of the trained weights kept beside them: DiffusionNFT's old policy (grpo.algorithm nft) and the moving
average of the weights (train.ema_decay) that Flow-GRPO's and DiffusionNFT's authors evaluate and save.

A `WeightCopy` holds each trainable parameter's local values (FSDP's shards, or whole tensors), float32 as the master
weights, swaps them into the modules while they run, and blends toward the trained weights. Both are in a
checkpoint (by parameter name), so a resume continues them exactly.

The moving average blends ema <- ema + (1 - d) (w - ema), d = min((1 + n) / (10 + n), train.ema_decay), after n
optimizer updates when n + 1 is a multiple of train.ema_every, train.ema_repeats times in all: Flow-GRPO's loop
steps the average after every micro-batch with the count of updates done, so the last micro-batch of update n blends
once and the other repeats - 1 come with the next update's micro-batches, before its optimizer step, on the same
weights (`ema_blends`). DiffusionNFT's steps once per update (repeats 1).

May import: torch.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class WeightCopy:
    """A copy of each trainable parameter's local values, swapped into the modules when it runs."""

    def __init__(self, params: list[torch.nn.Parameter], modules: list[torch.nn.Module]):
        self.params = params
        self.modules = modules
        with torch.no_grad():
            self.copies = [p.detach().clone() for p in params]

    def _reshard(self) -> None:
        # FSDP keeps the root's gathered parameters after a forward: a swap must drop every gathered copy, or the
        # next forward would run on the other weights' values.
        from torch.distributed.fsdp import FSDPModule

        for module in self.modules:
            for sub in module.modules():
                if isinstance(sub, FSDPModule):
                    sub.reshard()

    @torch.no_grad()
    def _swap(self) -> None:
        self._reshard()
        for p, copy in zip(self.params, self.copies):
            held = p.detach().clone()
            p.detach().copy_(copy)
            copy.copy_(held)

    @contextmanager
    def swapped_in(self):
        """Run the modules with the copy's weights; the trained ones are back on the way out."""
        self._swap()
        try:
            yield
        finally:
            self._swap()
            self._reshard()

    @torch.no_grad()
    def reset(self) -> None:
        """The copy becomes the trained weights as they are now (after a load)."""
        for p, copy in zip(self.params, self.copies):
            copy.copy_(p.detach())

    @torch.no_grad()
    def mix(self, decay: float) -> None:
        """copy <- decay copy + (1 - decay) trained (DiffusionNFT's old policy, as its authors write it)."""
        for p, copy in zip(self.params, self.copies):
            copy.mul_(decay).add_(p.detach(), alpha=1 - decay)

    @torch.no_grad()
    def blend(self, decay: float) -> None:
        """copy <- copy + (1 - decay) (trained - copy) (the moving average, as its authors write it)."""
        for p, copy in zip(self.params, self.copies):
            copy.add_((1 - decay) * (p.detach() - copy))

    def state(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The copies by parameter name, for the checkpoint (loaded in place)."""
        return dict(zip(names, self.copies))


def ema_decay(updates: int, ceiling: float) -> float:
    """The moving average's decay after `updates` optimizer updates: its warm-up min((1 + n) / (10 + n), ceiling)."""
    return min((1 + updates) / (10 + updates), ceiling)


def ema_blends(update: int, every: int, repeats: int) -> tuple[int, int]:
    """How many times the moving average blends around optimizer update `update` (1-based; train.ema_every,
    _repeats): (before its optimizer step, at the decay of update - 1 updates; after it, at the decay of `update`).
    Flow-GRPO's loop steps the average after each of an update's micro-batches with the count of updates done, so
    its first repeats - 1 calls come before the update's step and its last one after."""
    before = repeats - 1 if update % every == 0 else 0
    return before, 1 if (update + 1) % every == 0 else 0


def step_ema(ema: WeightCopy, update: int, t, after: bool) -> None:
    """The moving average's blends before (`after` false) or after optimizer update `update` (the train section
    `t`)."""
    before, later = ema_blends(update, t.ema_every, t.ema_repeats)
    for _ in range(later if after else before):
        ema.blend(ema_decay(update if after else update - 1, t.ema_decay))


def ema_record(t, updates: int) -> dict:
    """What ema/'s training_state.json says of its average: the settings and how many blends `updates` optimizer
    updates made (0: the average is the initial weights)."""
    blends = sum(sum(ema_blends(n, t.ema_every, t.ema_repeats)) for n in range(1, updates + 1))
    return {"decay": t.ema_decay, "every": t.ema_every, "repeats": t.ema_repeats, "updates": updates, "blends": blends}
