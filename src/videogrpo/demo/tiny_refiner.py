"""A tiny random prompt refiner: transformers' Qwen2 causal language model with two layers (or, `vision`, a
Qwen2.5-VL of the same text stack and a one-block vision tower, with its image processor) and a character-level
tokenizer that carries a Qwen-style chat template, built from configs with a fixed seed and saved with
`save_pretrained`, so that training loads it exactly as it loads a real Qwen2.5 Instruct snapshot
(AutoTokenizer, AutoModelForCausalLM, the tokenizer's chat template).

A random model would end a rewrite by chance (about 1 token in 80), so most rewrites would run to the cap. Every
token's embedding carries one constant coordinate and only the end-of-turn token's output row reads it
(EOS_PULL), which makes the end-of-turn token about one draw in ten: the tiny default sees rewrites that are used,
empty ones and ones cut at the cap, the last two falling back to the prompt.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from videogrpo.models.refiner import TINY_TEXT, TINY_VISION, TINY_VOCABULARY

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,;:!?'\"-()/\n"
VISION_SPECIALS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
"""The vision-language refiner's image tokens, as Qwen2.5-VL's tokenizer names them."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_PIXELS = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
"""The tiny vision refiner's image sizes: a first frame becomes 4 to 16 image tokens."""
EOS_PULL = 0.25
"""The end-of-turn token's output weight on the embeddings' constant coordinate."""


def build_tokenizer(vision: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte-level, as Qwen's tokenizers: each character is its byte's printable stand-in (a space is 'Ġ'), with no
    # merges, so every token is one character.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    stand_in = {chr(b): c for b, c in zip(range(256), sorted(alphabet, key=_byte_of)) if chr(b) in CHARS}
    extra = VISION_SPECIALS if vision else ()
    vocab = {token: i for i, token in enumerate((*SPECIALS, *(stand_in[c] for c in CHARS), *extra))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([*SPECIALS[:3], *extra])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )


def _byte_of(stand_in: str) -> int:
    """The byte GPT-2's byte-level scheme writes as `stand_in` (printable bytes as themselves, the others from
    U+0100 on, in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if ord(stand_in) in printable:
        return ord(stand_in)
    others = [b for b in range(256) if b not in printable]
    return others[ord(stand_in) - 256]


def save_tiny_refiner(out_dir: str | Path, seed: int, vision: bool = False) -> None:
    """The tiny refiner: a Qwen2 causal language model, or (`vision`) a Qwen2.5-VL that sees an image, with its
    tokenizer (and image processor)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(vision)
    assert len(tokenizer) == TINY_VOCABULARY[vision], "models/refiner.py's TINY_VOCABULARY is the tokenizer's size"
    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    text = dict(vocab_size=len(tokenizer), **ids, **TINY_TEXT)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if vision:
            image = {name: tokenizer.convert_tokens_to_ids(token) for name, token in zip(
                ("vision_start_token_id", "image_token_id", "vision_end_token_id", "video_token_id"), VISION_SPECIALS
            )}  # fmt: skip
            rope = {"type": "mrope", "mrope_section": [2, 1, 1]}
            config = Qwen2_5_VLConfig(
                text_config=dict(text, rope_scaling=rope), vision_config=TINY_VISION, **image, **ids
            )
            model = Qwen2_5_VLForConditionalGeneration(config)
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**text))
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 1.0
        model.get_output_embeddings().weight[:, 0] = 0.0
        model.get_output_embeddings().weight[tokenizer.eos_token_id, 0] = EOS_PULL
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    if vision:
        from transformers import Qwen2VLImageProcessorPil

        Qwen2VLImageProcessorPil(**IMAGE_PIXELS).save_pretrained(str(out_dir))
