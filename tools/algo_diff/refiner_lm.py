"""The prompt refiner's loss and advantages (grpo/refiner_loss.py) against PromptRL's and UniRL's own code
(README.md beside this file).

    python tools/algo_diff/refiner_lm.py PROMPTRL UNIRL [--promptrl-commit C] [--unirl-commit C] [--store FILE]

PROMPTRL: a checkout of G-U-N/UniRL (branch prompt_rl; the stored outputs are of 53c28c9), its git directory or a
plain tree; UNIRL: one of Tencent-Hunyuan/UniRL (1a7b501). Their trainers import their whole stacks (accelerate and
trl, their model zoos and distributed runtimes), so the tool takes the functions it compares out of their files'
text and runs them on their own, on stand-ins for what they read of their trainer (`self`):
- PromptRL's `compute_advantages`, `_completion_mask`, `_get_per_token_logps` and `cot_loss_computation`
  (unirl/trainer/geneval_grpo_trainer.py), on a tiny causal LM and a frozen copy of it: 6 completions of 3 prompts
  (group 2) with end-of-sequence tokens at different places, one completion cut at the token cap. Compared:
  the advantages, the completion mask, the loss and every gradient of the LM against `refiner_advantages(...,
  "shared")`, `completion_mask` and `refiner_loss(on_policy, sequence_token_mean, kl_weight 0.01)`.
- UniRL's `_grpo_clip_loss` (unirl/algorithms/base.py), `GRPO._expand_advantages_to_tokens` and the loss
  aggregation of `GRPO.compute_loss_and_backward` (unirl/algorithms/grpo.py) on the same completions packed as they
  pack them (varlen), with rollout log-probabilities off by up to 0.3 so that the clip acts, clip 0.2 and 0.28 high,
  for each of their three aggregations; and the group step of `RolloutTrack.compute_advantages`
  (unirl/types/rollout_resp.py) for 2 prompts x 3 rewrites x 4 videos, a rewrite's reward the mean of its videos'.
  Compared: each loss and its gradient with respect to the log-probabilities, and both tracks' advantages, against
  `refiner_loss(ppo_clip, ...)` and `refiner_advantages(..., "hierarchical")`.

Exit status: 0 when every comparison is within round-off, 1 when one is not, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
from checkout import block_source, function_source, print_rows, read_source, relative_differences, store

PROMPTRL_FILE = "unirl/trainer/geneval_grpo_trainer.py"
UNIRL_BASE, UNIRL_GRPO, UNIRL_RESP = (
    "unirl/algorithms/base.py",
    "unirl/algorithms/grpo.py",
    "unirl/types/rollout_resp.py",
)
TOLERANCE = 1e-6
EOS, VOCAB, PROMPT, COMPLETION, GROUP = 2, 11, 3, 5, 2
AGGREGATIONS = {"token-mean": "token_mean", "seq-mean-token-mean": "sequence_token_mean"}
AGGREGATIONS["seq-mean-token-sum-norm"] = "sequence_token_sum"
HORIZON = 8


def method_source(text: str, cls: str, name: str) -> str:
    """The source of method `name` of class `cls` in a module's text, dedented."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return textwrap.dedent(ast.get_source_segment(text, item, padded=True))
    raise OSError(f"no method {cls}.{name}")


class TinyLM(torch.nn.Module):
    """A causal LM as their code calls it: model(input_ids).logits."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, 8, generator=generator, dtype=torch.float64))
        self.mix = torch.nn.Parameter(torch.randn(8, 8, generator=generator, dtype=torch.float64) / 3)
        self.head = torch.nn.Parameter(torch.randn(8, VOCAB, generator=generator, dtype=torch.float64))

    def forward(self, input_ids):
        h = self.embed[input_ids]
        h = h + torch.cumsum(h, dim=1) @ self.mix  # each position sees the ones before it
        return SimpleNamespace(logits=torch.tanh(h) @ self.head)


def inputs() -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (6, PROMPT + COMPLETION), generator=generator)
    for row, at in enumerate((1, 3, 4, 0, None, 2)):  # row 4: cut at the cap, no end-of-sequence token
        if at is not None:
            ids[row, PROMPT + at] = EOS
    ids[1, PROMPT + 4] = EOS  # a second one after the first: only the first ends the completion
    rewards = torch.tensor([0.2, 0.9, 0.5, 0.5, 1.0, 0.1])  # float32, as a scorer's
    lengths = torch.tensor([2, 4, 5, 1, 5, 3])  # the varlen completion lengths for UniRL's packing
    logp = -torch.rand(6, COMPLETION, generator=generator, dtype=torch.float64) * 2
    rollout_logp = logp + (torch.rand(6, COMPLETION, generator=generator, dtype=torch.float64) - 0.5) * 0.6
    advantages = torch.randn(6, generator=generator, dtype=torch.float64)
    tree = torch.rand(2, 3, 4, generator=generator, dtype=torch.float64)
    tree[1, 2] = 0.5  # a rewrite whose videos all scored alike
    return {
        "ids": ids,
        "rewards": rewards,
        "lengths": lengths,
        "logp": logp,
        "rollout_logp": rollout_logp,
        "advantages": advantages,
        "tree": tree,
    }


# ---- the authors' side -------------------------------------------------------------------------------------------


def load(promptrl: Path, promptrl_commit: str, unirl: Path, unirl_commit: str) -> tuple[dict, str]:
    """Their functions out of their files' text, and the commits."""
    text, first = read_source(promptrl, promptrl_commit, PROMPTRL_FILE)
    namespace = {"torch": torch, "nn": torch.nn, "Dict": dict, "List": list, "Optional": None}
    methods = {}
    for name in ("compute_advantages", "_completion_mask", "_get_per_token_logps", "cot_loss_computation"):
        exec(compile(method_source(text, "_GenEvalGRPOBase", name), PROMPTRL_FILE, "exec"), namespace)  # noqa: S102
        methods[name] = namespace[name]
    base, second = read_source(unirl, unirl_commit, UNIRL_BASE)
    grpo, _ = read_source(unirl, unirl_commit, UNIRL_GRPO)
    resp, _ = read_source(unirl, unirl_commit, UNIRL_RESP)
    uni = {"torch": torch, "Optional": None, "Tuple": tuple, "Dict": dict, "List": list}
    exec(
        compile("from __future__ import annotations\n" + function_source(base, "_grpo_clip_loss"), UNIRL_BASE, "exec"),
        uni,
    )  # noqa: S102
    expand = method_source(grpo, "GRPO", "_expand_advantages_to_tokens").replace("@staticmethod\n", "")
    exec(compile("from __future__ import annotations\n" + expand, UNIRL_GRPO, "exec"), uni)  # noqa: S102
    loaded = {
        "promptrl": methods,
        "clip_loss": uni["_grpo_clip_loss"],
        "expand": uni["_expand_advantages_to_tokens"],
        "aggregate": block_source(grpo, "if self.loss_agg_mode in (", "loss = loss_per_elem.mean()"),
        "group_step": block_source(resp, "rewards = rewards_local.to(torch.float32)", "adv = (reshaped - mean) / std"),
    }
    return loaded, f"PromptRL {first}, UniRL {second}"


def promptrl_side(methods: dict, data: dict) -> dict:
    trainer = type("GRPOTrainer", (), dict(methods))()
    trainer.num_generations = GROUP
    trainer.processing_class = SimpleNamespace(eos_token_id=EOS)
    trainer.ref_model = TinyLM().requires_grad_(False)
    with torch.no_grad():
        trainer.ref_model.head.mul_(0.9)  # the frozen copy, a little off: the KL acts
    trainer.accelerator = SimpleNamespace(gather_for_metrics=lambda x: x)
    trainer._metrics = defaultdict(list)
    model = TinyLM()
    advantages = trainer.compute_advantages(data["rewards"])
    completions = data["ids"][:, PROMPT:]
    loss = trainer.cot_loss_computation(model, data["ids"], completions, PROMPT, advantages)
    loss.backward()
    out = {"advantages": advantages, "mask": trainer._completion_mask(completions).double(), "cot_loss": loss.detach()}
    out.update({f"grad_{n}": p.grad for n, p in model.named_parameters()})
    return out


def unirl_side(loaded: dict, data: dict) -> dict:
    out = {}
    mask = torch.arange(COMPLETION).unsqueeze(0) < data["lengths"].unsqueeze(1)
    for mode in AGGREGATIONS:
        new = data["logp"][mask].clone().requires_grad_(True)
        adv = loaded["expand"](data["advantages"], data["lengths"], dtype=new.dtype, device=new.device)
        loss_per_elem, _ = loaded["clip_loss"](
            new_logp=new, old_logp=data["rollout_logp"][mask], advantages=adv, clip_range=0.2, clip_range_high=0.28
        )
        scope = {"torch": torch, "loss_per_elem": loss_per_elem, "segment": SimpleNamespace(lengths=data["lengths"])}
        scope["self"] = SimpleNamespace(loss_agg_mode=mode, horizon=HORIZON)
        exec(loaded["aggregate"], scope)  # noqa: S102
        scope["loss"].backward()
        out[f"loss {mode}"] = scope["loss"].detach()
        grad = torch.zeros_like(data["logp"])
        grad[mask] = new.grad
        out[f"grad {mode}"] = grad
    tree = data["tree"]
    p, n, m = tree.shape
    for name, rewards, groups, branch in (
        ("refiner advantages", tree.mean(dim=2).flatten(), p, n),  # their propagate_rewards("mean"): a rewrite's videos
        ("generator advantages", tree.flatten(), p * n, m),
    ):
        scope = {"torch": torch, "rewards_local": rewards, "n_groups": groups, "branch": branch, "normalize": True}
        scope.update(use_global_std=False, eps=1e-8)
        exec(loaded["group_step"], scope)  # noqa: S102
        out[name] = scope["adv"].reshape(tree.shape[: 2 if name.startswith("refiner") else 3])
    return out


def authors_side(loaded: dict, data: dict) -> dict:
    return promptrl_side(loaded["promptrl"], data) | unirl_side(loaded, data)


# ---- this project's side -----------------------------------------------------------------------------------------


def project_side(data: dict) -> dict:
    from videogrpo.grpo import refiner_loss as R

    reference = TinyLM().requires_grad_(False)
    with torch.no_grad():
        reference.head.mul_(0.9)
    model = TinyLM()
    ids, completions = data["ids"], data["ids"][:, PROMPT:]
    logp = R.token_log_probs(model(ids).logits[:, :-1], ids[:, 1:])[:, PROMPT - 1 :]
    with torch.no_grad():
        ref = R.token_log_probs(reference(ids).logits[:, :-1], ids[:, 1:])[:, PROMPT - 1 :]
    refiner, generator = R.refiner_advantages(data["rewards"].view(-1, GROUP), "shared")
    mask = R.completion_mask(completions, EOS)
    loss = R.refiner_loss(
        logp,
        mask,
        refiner.flatten().double(),
        loss="on_policy",
        normalization="sequence_token_mean",
        reference_log_probs=ref,
        kl_weight=0.01,
    ).loss
    loss.backward()
    out = {"advantages": refiner.flatten(), "mask": mask.double(), "cot_loss": loss.detach()}
    out.update({f"grad_{n}": p.grad for n, p in model.named_parameters()})
    lengths_mask = (torch.arange(COMPLETION).unsqueeze(0) < data["lengths"].unsqueeze(1)).int()
    for mode, normalization in AGGREGATIONS.items():
        new = data["logp"].clone().requires_grad_(True)
        loss = R.refiner_loss(
            new,
            lengths_mask,
            data["advantages"],
            loss="ppo_clip",
            normalization=normalization,
            rollout_log_probs=data["rollout_logp"],
            clip_range=0.2,
            clip_range_high=0.28,
            horizon=HORIZON,
        ).loss
        loss.backward()
        out[f"loss {mode}"], out[f"grad {mode}"] = loss.detach(), new.grad * lengths_mask
    refiner, generator = R.refiner_advantages(data["tree"], "hierarchical")
    out["refiner advantages"], out["generator advantages"] = refiner, generator
    return out


HEADER = (
    "PromptRL's advantages, completion mask and LM loss with its gradients; UniRL's clipped loss in its three "
    "aggregations with their gradients, and its hierarchical advantages"
)


def compare(theirs: dict, ours: dict) -> list[tuple[str, float, bool]]:
    """Each output's largest difference relative to its largest magnitude; PromptRL's loss, a mean of advantage-
    weighted terms that nearly cancel (the advantages sum to 0), relative to the largest advantage instead."""
    rows = relative_differences(theirs, {k: v.double() for k, v in ours.items()}, TOLERANCE)
    scale = float(theirs["advantages"].abs().max())
    worst = float((ours["cot_loss"].double() - theirs["cot_loss"].double()).abs()) / scale
    return [("cot_loss", worst, worst <= TOLERANCE) if row[0] == "cot_loss" else row for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("promptrl", type=Path, help="a G-U-N/UniRL (prompt_rl) checkout, git directory or tree")
    parser.add_argument("unirl", type=Path, help="a Tencent-Hunyuan/UniRL checkout, git directory or tree")
    parser.add_argument("--promptrl-commit", default="HEAD")
    parser.add_argument("--unirl-commit", default="HEAD")
    parser.add_argument("--store", type=Path, help="write the inputs and the authors' outputs to this file")
    args = parser.parse_args(argv)
    data = inputs()
    try:
        loaded, commits = load(args.promptrl.resolve(), args.promptrl_commit, args.unirl.resolve(), args.unirl_commit)
        theirs = authors_side(loaded, data)
    except (OSError, ImportError, SyntaxError) as err:
        print(f"refiner_lm: could not run the authors' code: {err}", file=sys.stderr)
        return 2
    print(f"{commits}: {HEADER}")
    ok = print_rows(compare(theirs, project_side(data)))
    store(args.store, {"commit": commits, "inputs": data, "theirs": theirs})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
