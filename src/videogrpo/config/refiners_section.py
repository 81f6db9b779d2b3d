"""The `refiners` section of the config: prompt refiners trained with the generator (docs/options.md#prompt-refiners).
Off by default (no experts): the generator rolls out from each sample's own prompt, as the released recipes. On,
each expert, a causal language model, rewrites the prompt in turn before the generator rolls out, and is trained
from the same rewards with its own optimizer. Its own module so that the sections stay legible; `config.sections`
assembles it into the Config, and `refiner_problems` holds its rules.

May import: the core modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CREDITS = ("shared", "per_expert", "hierarchical")
SOURCES = ("hub", "tiny")
LOSSES = ("on_policy", "ppo_clip")
NORMALIZATIONS = ("sequence_token_mean", "token_mean", "sequence_token_sum")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

DEFAULT_SYSTEM_PROMPT = (
    "You rewrite the instruction of a video generation task so that the video carries out its solution step by "
    "step. Keep every object, colour and position the instruction names. Answer with the rewritten instruction only."
)


@dataclass
class RefinerExpert:
    """One refiner: a causal language model pinned like the generator, its sampling settings and its optimizer's."""

    name: str = "refiner"
    """Its name: lower-case letters, digits and `_` (its checkpoint part, export folder and metrics' prefix)."""
    source: str = "hub"
    """`hub` (a pinned snapshot of repo_id) or `tiny` (a random Qwen2 of a few layers, built from a config)."""
    repo_id: str = "Qwen/Qwen2.5-3B-Instruct"
    """Hub repository of the causal language model and its tokenizer (with a chat template)."""
    revision: str = ""
    """40-hex commit of repo_id; branch and tag names are refused."""
    tiny_seed: int = 0
    """Seed of the tiny model's random weights (source `tiny` only)."""
    vision: bool = False
    """A vision-language refiner (Qwen2.5-VL) that sees the sample's first frame beside the prompt; `tiny` builds one,
    a Hub snapshot must be one (its config's model type)."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system message of the chat the refiner answers; the user message is the prompt to rewrite."""
    temperature: float = 1.0
    """Sampling temperature; the replay scores the tokens at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p (1: every token)."""
    max_new_tokens: int = 512
    """Token cap of a rewrite; one cut at the cap (no end-of-sequence token) falls back to the prompt it rewrote."""
    answer_tag: str = ""
    """The tag the rewrite is read from (`answer`: the text between <answer> and </answer>; one without it falls
    back); empty: the whole completion is the rewrite."""
    lr: float = 1.0e-6
    """Peak learning rate of its AdamW, on train.lr_schedule's shape (warmup and decay as the generator's)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Its own gradient-norm clip (the generator keeps train.max_grad_norm)."""
    loss: str = "on_policy"
    """`on_policy`: the surrogate -exp(logp - sg(logp)) A; `ppo_clip`: the ratio to the rollout's log-probs,
    clipped at clip_range."""
    clip_range: float = 0.01
    """PPO clip range of the ratio (loss `ppo_clip` only)."""
    kl_coeff: float = 0.0
    """Weight of the k3 KL to a frozen copy of its initial weights (0: no copy is kept)."""
    normalization: str = "sequence_token_mean"
    """How token losses make the loss: `sequence_token_mean` (each rewrite's token mean, then the mean over
    rewrites), `token_mean` (over every token of the batch), `sequence_token_sum` (each rewrite's token sum over
    max_new_tokens, then the mean)."""
    lora_rank: int = 0
    """Rank of the adapters trained on every linear layer of its language model, the base frozen (0: full
    fine-tuning); its KL's reference is then the base itself (the adapters off), with no copy."""
    lora_alpha: float = 0.0
    """The adapters' alpha (their scale is alpha / rank); 0: the rank (a scale of 1)."""
    reward_term: str = ""
    """Credit `per_expert`: the reward kind of reward.terms whose score alone drives this refiner."""


@dataclass
class RefinersConfig:
    """Prompt refiners trained with the generator (docs/options.md#prompt-refiners): off while `experts` is empty."""

    experts: list[RefinerExpert] = field(default_factory=list)
    """The refiners, applied in turn: each rewrites the previous one's rewrite (the first the sample's prompt)."""
    credit: str = "shared"
    """`shared`: each rewrite's advantage is its video's (one advantage drives every expert); `per_expert`: each
    refiner's from its own reward term (its reward_term), the generator's from the total reward; `hierarchical`
    (with rewrites_per_prompt): a rewrite's reward is the mean of its videos', its advantage over the prompt's
    rewrites, each video's over its rewrite's videos, both over sqrt(population variance + 1e-8)."""
    rewrites_per_prompt: int = 0
    """UniRL's layout, with credit `hierarchical`: N rewrites of each prompt, each rolled out by group_size / N members
    (member g reads rewrite g // (group_size / N)); 0: each member samples its own rewrite."""
    original_members: int = 0
    """Members of each group kept on the original prompt (the first ones): their videos are in the group, they train
    no refiner (PromptRL's editing runs keep 2 of 8)."""


def refiner_problems(cfg) -> list[str]:
    """The refiners' rules, each naming the field (`refiners.experts[i].field`), the value and the fix."""
    r = cfg.refiners
    if not r.experts:
        return []
    found = []
    if r.credit not in CREDITS:
        found.append(f"refiners.credit = {r.credit!r}: must be one of {', '.join(CREDITS)}")
    if not 0 <= r.original_members < cfg.grpo.group_size:
        found.append(
            f"refiners.original_members = {r.original_members}: must be >= 0 and leave at least one of the "
            f"grpo.group_size = {cfg.grpo.group_size} members to rewrite"
        )
    n, g = r.rewrites_per_prompt, cfg.grpo.group_size
    if (r.credit == "hierarchical") != (n > 0):
        found.append(
            f"refiners.credit = {r.credit!r} with refiners.rewrites_per_prompt = {n}: the hierarchical credit is that "
            "of N rewrites x M videos of a prompt; set both (credit hierarchical, rewrites_per_prompt N) or neither"
        )
    elif n and (n < 2 or g % n or g // n < 2):
        found.append(
            f"refiners.rewrites_per_prompt = {n}: must be 2 or more and divide grpo.group_size = {g} into rewrites of "
            "2 or more videos each (a rewrite's advantage is over the prompt's rewrites, a video's over its rewrite's)"
        )
    elif n:
        clashes = [
            name
            for name, on in (
                ("refiners.original_members", r.original_members),
                ("grpo.skip_zero_variance_groups", cfg.grpo.skip_zero_variance_groups),
                ("grpo.shuffle_advantages", cfg.grpo.shuffle_advantages),
            )
            if on
        ]
        if clashes:
            found.append(
                f"refiners.credit hierarchical with {', '.join(clashes)}: not combined (their groups are the prompt's "
                "members, the hierarchical credit's a rewrite's videos); turn them off"
            )
    names = [e.name for e in r.experts]
    if len(set(names)) < len(names):
        found.append(f"refiners.experts: names {names} repeat; give each refiner its own name")
    terms = dict(cfg.reward.terms or {})
    for i, e in enumerate(r.experts):
        at = f"refiners.experts[{i}]"
        if not NAME.match(e.name):
            found.append(f"{at}.name = {e.name!r}: use lower-case letters, digits and '_', starting with a letter")
        for key, allowed in (("source", SOURCES), ("loss", LOSSES), ("normalization", NORMALIZATIONS)):
            if getattr(e, key) not in allowed:
                found.append(f"{at}.{key} = {getattr(e, key)!r}: must be one of {', '.join(allowed)}")
        if e.source == "hub":
            if not HEX40.match(e.revision):
                found.append(
                    f"{at}.revision = {e.revision!r}: must be a lower-case 40-hex commit id (branch and tag "
                    "names move: refused)"
                )
            if not e.repo_id:
                found.append(f"{at}.repo_id is empty: name the Hub repository of the refiner")
        for key in ("temperature", "max_new_tokens", "lr", "max_grad_norm", "clip_range"):
            if getattr(e, key) <= 0:
                found.append(f"{at}.{key} = {getattr(e, key)!r}: must be > 0")
        for key in ("weight_decay", "kl_coeff", "tiny_seed", "lora_rank", "lora_alpha"):
            if getattr(e, key) < 0:
                found.append(f"{at}.{key} = {getattr(e, key)!r}: must be >= 0")
        if not 0 < e.top_p <= 1:
            found.append(f"{at}.top_p = {e.top_p!r}: must be in (0, 1]")
        if e.answer_tag and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", e.answer_tag):
            found.append(f"{at}.answer_tag = {e.answer_tag!r}: a tag name (letters, digits, '_', '-'), or empty")
        if r.credit == "per_expert":
            if e.reward_term not in terms:
                found.append(
                    f"{at}.reward_term = {e.reward_term!r}: credit per_expert drives each refiner by its own reward "
                    f"term; name one of reward.terms ({', '.join(sorted(terms)) or 'empty: set reward.terms'})"
                )
        elif e.reward_term:
            found.append(f"{at}.reward_term = {e.reward_term!r} is read under refiners.credit per_expert only")
    par = cfg.parallel
    refused = (
        (cfg.has_actors, "rollout actors (the actors section): the actors would have to rewrite too"),
        (par.tensor_parallel > 1, f"parallel.tensor_parallel = {par.tensor_parallel}: the refiners are not split"),
        (cfg.grpo.algorithm == "nft", "grpo.algorithm nft: the refiners' loss is a policy gradient of GRPO's"),
    )
    off = "not available yet (refiners.experts: [] turns the refiners off)"
    found += [f"refiners with {why}; {off}" for refuse, why in refused if refuse]
    return found


def refined_model_problems(cfg) -> list[str]:
    """matrix.models' `refined` and `base_refiners` rewrite the prompts with the run's refiners: they need some."""
    wanted = [m for m in cfg.matrix.models if m in ("refined", "base_refiners")]
    if wanted and not cfg.refiners.experts:
        return [
            f"matrix.models lists {', '.join(map(repr, wanted))}, which rewrite each prompt with the run's prompt "
            "refiners, and refiners.experts is empty; add refiners, or drop them (`trained` is the generator alone)"
        ]
    return []
