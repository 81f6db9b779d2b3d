"""A prompt refiner: a causal language model and its tokenizer, loaded from a pinned snapshot (or the tiny one,
demo/tiny_refiner.py) as transformers loads any such repository, and the two things training asks of it.

- `sample`: one rewrite, token by token with the key-value cache, at a temperature and a top-p, each token drawn
  by inverting the nucleus' cumulative distribution at a given uniform (the caller keys the uniforms by what the
  rewrite is for, so a rewrite does not depend on the rank, the batch or the other rows). It records each token's
  log-probability under the temperature-scaled distribution, before the nucleus cut: what the replay recomputes.
- `completion_logits`: the logits that score a completion's tokens after its chat prompt, one sequence at a time
  (no padding: a row's numbers do not depend on which rows share its forward).

A vision-language refiner (a Qwen2.5-VL snapshot: its config's model type says so) also sees an image, the sample's
first frame: `chat` puts it in the user message and returns the image processor's inputs, which the prompt's
forward (sampling's first, the replay's) takes beside the token ids. Its image processor is the snapshot's own (the
PIL implementation: nothing else is installed).

May import only the core modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

TINY_TEXT = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
"""The tiny refiner's text stack (demo/tiny_refiner.py builds it; the memory plan counts it without building it)."""
TINY_VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=TINY_TEXT["hidden_size"],  # the vision tower's tokens enter the text stack
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=56,
    fullatt_block_indexes=[0],
)
"""The tiny vision-language refiner's one-block vision tower."""
TINY_VOCABULARY = {False: 80, True: 84}
"""The tiny tokenizer's size: its 4 special tokens and 76 characters, and the 4 image tokens of the vision one."""


def tiny_config(vision: bool) -> dict:
    """The tiny refiner's model config as the memory plan reads a config.json (its shape only)."""
    text = dict(vocab_size=TINY_VOCABULARY[vision], **TINY_TEXT)
    if not vision:
        return {"model_type": "qwen2", **text}
    rope = {"type": "mrope", "mrope_section": [2, 1, 1]}
    return {"model_type": "qwen2_5_vl", "text_config": dict(text, rope_scaling=rope), "vision_config": TINY_VISION}


VISION_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")
IMAGE_TOKEN = "<|image_pad|>"


@dataclass
class Refiner:
    tokenizer: object
    model: torch.nn.Module
    eos_token_id: int
    image_processor: object | None = None
    """A vision-language refiner's image processor; None for a language model alone."""

    @property
    def sees_images(self) -> bool:
        return self.image_processor is not None

    @classmethod
    def load(cls, path: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> Refiner:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if tokenizer.eos_token_id is None or not tokenizer.chat_template:
            raise ValueError(f"{path}: the refiner's tokenizer needs an end-of-sequence token and a chat template")
        if AutoConfig.from_pretrained(str(path)).model_type not in VISION_MODEL_TYPES:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
            return cls(tokenizer, model, int(tokenizer.eos_token_id))
        from transformers import AutoModelForImageTextToText, Qwen2VLImageProcessorPil

        model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype).to(device)
        images = Qwen2VLImageProcessorPil.from_pretrained(str(path))
        return cls(tokenizer, model, int(tokenizer.eos_token_id), images)

    def chat(self, system_prompt: str, text: str, image: Path | None = None) -> tuple[list[int], dict | None]:
        """(the token ids of the chat that asks for `text`'s rewrite, ending where the answer begins; the image
        processor's inputs, or None): a vision-language refiner sees `image` before the text, its image token
        repeated once per merged patch, as its processor lays it out."""
        if not self.sees_images:
            messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": text}]
            chat = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            return list(chat), None
        from PIL import Image

        if image is None:
            raise ValueError("a vision-language refiner rewrites a prompt with its first frame: none was given")
        parts = [{"type": "image"}, {"type": "text", "text": text}]
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": parts}]
        chat = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        with Image.open(image) as frame:
            vision = dict(self.image_processor(images=[frame.convert("RGB")], return_tensors="pt"))
        merged = int(vision["image_grid_thw"].prod()) // self.image_processor.merge_size**2
        chat = chat.replace(IMAGE_TOKEN, IMAGE_TOKEN * merged, 1)
        return self.tokenizer(chat, add_special_tokens=False)["input_ids"], vision

    def chat_ids(self, system_prompt: str, text: str) -> list[int]:
        """The token ids of a language model's chat that asks for `text`'s rewrite."""
        return self.chat(system_prompt, text)[0]

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
    vision: dict | None = None,
) -> tuple[list[int], list[float]]:
    """(the sampled tokens, up to and including the first end-of-sequence token or len(uniforms) of them; each
    token's log-probability at the temperature). `vision`: a vision-language refiner's image inputs (`chat`)."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([prompt_ids], device=device), **on_device(vision, device))
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


def completion_logits(
    model: torch.nn.Module, prompt_ids: list[int], completion: list[int], vision: dict | None = None
) -> torch.Tensor:
    """[len(completion), V]: the logits that score each completion token (one forward of prompt + completion)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion[:-1]], device=device)
    return model(input_ids=ids, **on_device(vision, device)).logits[0, len(prompt_ids) - 1 :]


def on_device(vision: dict | None, device: torch.device) -> dict:
    return {key: value.to(device) for key, value in (vision or {}).items()}


def answer_text(text: str, tag: str) -> str | None:
    """The rewrite in a completion's text: between <tag> and </tag> (the first such pair), or the whole text when
    `tag` is empty; None when the tag is missing or the rewrite is empty."""
    if tag:
        found = re.search(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
        text = found.group(1) if found else ""
    text = text.strip()
    return text or None
