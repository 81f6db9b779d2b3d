"""A byte-bounded, least-recently-used cache of prompt embeddings, kept on CPU.

A run visits each prompt once per epoch: embeddings of the released data (512 tokens x 4096 dims in
float32, 8 MiB each, 50,000 prompts) would not fit on a GPU nor, unbounded, in host memory. The cache
holds what fits in `model.prompt_cache_bytes` on CPU; the caller moves a batch's rows to the device.
Entries are stored as computed (float32), so a hit returns the bytes a fresh encoding returned.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

HOST = torch.device("cpu")


class PromptCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __contains__(self, prompt: str) -> bool:
        return prompt in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prompt: str) -> torch.Tensor | None:
        """The cached embedding (on CPU), marked most recently used; None when absent."""
        found = self._entries.get(prompt)
        if found is not None:
            self._entries.move_to_end(prompt)
        return found

    def put(self, prompt: str, embeds: torch.Tensor) -> None:
        """Keep a CPU copy of `embeds`, evicting the least recently used entries until it fits; an entry larger
        than the whole budget is not kept."""
        size = embeds.numel() * embeds.element_size()
        if prompt in self._entries:
            self.bytes -= self._nbytes(self._entries.pop(prompt))
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= self._nbytes(evicted)
        self._entries[prompt] = embeds.detach().to(HOST, copy=True)
        self.bytes += size

    def tensors(self) -> list[torch.Tensor]:
        return list(self._entries.values())

    @staticmethod
    def _nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()
