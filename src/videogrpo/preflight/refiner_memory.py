"""The prompt refiners' share of a train rank's memory (the `refiners` section): each refiner is replicated on every
rank in float32, with its gradients, its AdamW moments and (kl_coeff > 0) a frozen copy, and replays one rewrite at
a time (its chat and its tokens, forward and backward without checkpointing).

A refiner's shape comes from its config: the download's config.json where it is there (preflight), else the
published config of a refiner this module knows (`KNOWN`: `videogrpo plan` and `simulate` on a machine without the
download), else the tiny builder's. Its parameters are counted by building it on the meta device (no memory).

May import: `models` (the tiny refiner's shape), `grpo` (its adapters' layers), `plan_terms` and the core modules.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

FLOAT32 = 4
VISION_TEXT = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
KNOWN = {
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "model_type": "qwen2_5_vl",
        **VISION_TEXT,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
    },
    "Qwen/Qwen2.5-3B-Instruct": {"model_type": "qwen2", **VISION_TEXT},
}
"""Published configs of refiners the plan knows without their download (the fields that decide their shape)."""


def refiner_config(expert, download: Path | None = None) -> dict:
    """A refiners.experts record's model config, as a dict."""
    if download is not None and (download / "config.json").is_file():
        return json.loads((download / "config.json").read_text())
    if expert.source == "hub":
        if expert.repo_id not in KNOWN:
            raise KeyError(
                f"refiners.experts ({expert.name}): {expert.repo_id} is downloaded by fetch_refiner before its memory "
                f"can be planned (the plan knows {', '.join(sorted(KNOWN))} without it)"
            )
        return dict(KNOWN[expert.repo_id])
    from videogrpo.models.refiner import tiny_config

    return tiny_config(expert.vision)


def parameters(config: dict, lora_rank: int = 0) -> int:
    """The refiner's parameters, or (lora_rank > 0) its adapters' (rank x (inputs + outputs) of every linear layer
    grpo.refiners.LORA_TARGETS names), counted on the meta device (once per config: a planner plans many layouts)."""
    return _parameters(json.dumps(config, sort_keys=True), lora_rank)


@functools.cache
def _parameters(config_json: str, lora_rank: int) -> int:
    import re

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = json.loads(config_json)
    fields = {k: v for k, v in config.items() if k != "model_type"}
    made = AutoConfig.for_model(config["model_type"], **fields)
    auto = AutoModelForImageTextToText if "vision_config" in config else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(made)
    if not lora_rank:
        return sum(p.numel() for p in model.parameters())
    from videogrpo.grpo.refiners import LORA_TARGETS

    targets = [m for name, m in model.named_modules() if re.match(LORA_TARGETS, name)]
    return sum(lora_rank * (m.in_features + m.out_features) for m in targets)


def text_shape(config: dict) -> dict:
    """The text stack's hidden size, MLP width, layers and vocabulary (a VL config nests them in text_config)."""
    text = {**config, **config.get("text_config", {})}
    return {k: text[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")}


def replay_activations(config: dict, tokens: int) -> int:
    """Bytes of one rewrite's replay held for its backward, float32, no checkpointing: per layer and token the
    residual stream, the norms' and attention's inputs and outputs (8 x hidden) and the MLP's gate, up and product
    (3 x its width); the logits, their log-softmax and its gradient (3 x vocabulary)."""
    s = text_shape(config)
    per_token = s["num_hidden_layers"] * (8 * s["hidden_size"] + 3 * s["intermediate_size"]) + 3 * s["vocab_size"]
    return FLOAT32 * tokens * per_token


def terms(cfg, phases: tuple[str, ...], downloads: dict[str, Path] | None = None) -> list:
    """The memory plan's terms of the run's refiners (memory_plan.Term), each held in every phase."""
    from videogrpo.preflight.plan_terms import REPLAY_WORKING_SET, Term, gib

    found = []
    for e in cfg.refiners.experts:
        try:
            config = refiner_config(e, (downloads or {}).get(e.name))
        except KeyError as err:  # said in the plan, not guessed
            found.append(Term(f"refiner {e.name}", 0, phases, f"not counted: {err.args[0]}"))
            continue
        n = parameters(config)
        # The chat: the system prompt and the prompt (a few hundred tokens: the model's text limit stands in).
        tokens = cfg.model.max_text_tokens + e.max_new_tokens
        if e.lora_rank:  # the frozen base once (it is the KL's reference too), the adapters trained
            adapters = parameters(config, e.lora_rank)
            held = FLOAT32 * (n + 4 * adapters)
            detail = (
                f"{n / 1e9:.2f} B frozen parameters x {FLOAT32} B + {adapters / 1e6:.1f} M adapter parameters (rank "
                f"{e.lora_rank}) x {FLOAT32} B x 4 (weights, gradients, AdamW's 2 moments)"
            )
        else:
            copies = 4 + (1 if e.kl_coeff > 0 else 0)  # weights, gradients, 2 AdamW moments, the frozen copy
            held = copies * FLOAT32 * n
            detail = (
                f"{n / 1e9:.2f} B parameters x {FLOAT32} B x ({copies} copies: weights, gradients, AdamW's 2 moments"
                + (", the frozen copy)" if e.kl_coeff > 0 else ")")
            )
        found.append(Term(f"refiner {e.name}", held, phases, detail))
        activations = replay_activations(config, tokens)
        found.append(
            Term(
                f"refiner {e.name} replay",
                activations,
                phases[1:2],
                f"one rewrite of {tokens} tokens (model.max_text_tokens + max_new_tokens) replayed in float32: "
                f"{gib(activations)}, after the generator's replay (the larger of the two counts)",
                alternative=REPLAY_WORKING_SET,
            )
        )
    return found
