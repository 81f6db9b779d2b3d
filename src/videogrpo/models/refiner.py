"""A prompt refiner: a causal language model and its tokenizer, loaded from a pinned snapshot (or the tiny one,
demo/tiny_refiner.py) as transformers loads any such repository, and the two things training asks of it.

- `sample`: one rewrite, token by token with the key-value cache, at a temperature and a top-p, each token drawn
  by inverting the nucleus' cumulative distribution at a given uniform (the caller keys the uniforms by what the
  rewrite is for, so a rewrite does not depend on the rank, the batch or the other rows). It records each token's
  log-probability under the temperature-scaled distribution, before the nucleus cut: what the replay recomputes.
- `completion_logits`: the logits that score a completion's tokens after its chat prompt, one sequence at a time
  (no padding: a row's numbers do not depend on which rows share its forward).

May import only the core modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Refiner:
    tokenizer: object
    model: torch.nn.Module
    eos_token_id: int

    @classmethod
    def load(cls, path: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> Refiner:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if tokenizer.eos_token_id is None or not tokenizer.chat_template:
            raise ValueError(f"{path}: the refiner's tokenizer needs an end-of-sequence token and a chat template")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        return cls(tokenizer, model, int(tokenizer.eos_token_id))

    def chat_ids(self, system_prompt: str, text: str) -> list[int]:
        """The token ids of the chat that asks for `text`'s rewrite, ending where the answer begins."""
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": text}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def nucleus_pick(probs: torch.Tensor, top_p: float, uniform: float) -> int:
    """The token whose interval of the nucleus' renormalised cumulative distribution holds `uniform`: the smallest
    set of most probable tokens whose mass reaches top_p (ties by token id), at least one."""
    order = torch.argsort(probs, descending=True, stable=True)
    sorted_probs = probs[order].double()
    before = sorted_probs.cumsum(0) - sorted_probs
    kept = sorted_probs[before < top_p]
    cumulative = kept.cumsum(0) / kept.sum()
    index = int(
        torch.searchsorted(cumulative, torch.tensor([uniform], dtype=cumulative.dtype)).clamp_max(len(kept) - 1)
    )
    return int(order[index])


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompt_ids: list[int],
    uniforms: list[float],
    temperature: float,
    top_p: float,
    eos_token_id: int,
) -> tuple[list[int], list[float]]:
    """(the sampled tokens, up to and including the first end-of-sequence token or len(uniforms) of them; each
    token's log-probability at the temperature)."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([prompt_ids], device=device))
    tokens, log_probs = [], []
    for u in uniforms:
        scaled = (out.logits[0, -1].float() / temperature).log_softmax(-1)
        token = nucleus_pick(scaled.exp(), top_p, u)
        tokens.append(token)
        log_probs.append(float(scaled[token]))
        if token == eos_token_id:
            break
        out = model(input_ids=torch.tensor([[token]], device=device), cache=out.cache)
    return tokens, log_probs


def completion_logits(model: torch.nn.Module, prompt_ids: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion), V]: the logits that score each completion token (one forward of prompt + completion)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion[:-1]], device=device)
    return model(input_ids=ids).logits[0, len(prompt_ids) - 1 :]


def answer_text(text: str, tag: str) -> str | None:
    """The rewrite in a completion's text: between <tag> and </tag> (the first such pair), or the whole text when
    `tag` is empty; None when the tag is missing or the rewrite is empty."""
    if tag:
        found = re.search(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
        text = found.group(1) if found else ""
    text = text.strip()
    return text or None
