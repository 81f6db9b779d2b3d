"""Prompt refiners trained with the generator (the `refiners` section, docs/options.md#prompt-refiners): each expert
a causal language model that rewrites the prompt in turn before the generator rolls out, with its own AdamW,
learning rate, gradient clip, KL to a frozen copy and weight version.

Rollout (`rewrite_rows`): a row's rewrite is sampled token by token with draws keyed by (seed, batch, prompt,
member, expert), so it does not depend on the rank, the wave or a resume. A rewrite cut at the token cap (no
end-of-sequence token), or without its answer tag, or empty, falls back to the text it rewrote: counted, logged and
written beside the others, never silent; its tokens are still trained. The first `refiners.original_members`
members of a group keep the sample's prompt and train no refiner. Rewards are scored against the sample's own
prompt and task (the scorer reads the sample's directory), so a rewrite cannot earn reward by rewording the task.

Update (`step`): each expert's loss is grpo/refiner_loss.py's over its rewrites' tokens, with each rewrite's
advantage from `advantages` (`shared`: its video's; `per_expert`: its own reward term's group advantage). The
refiner is replicated on every rank: each rank backpropagates its rows' share of the batch-wide aggregate and the
gradients are averaged, so the update does not depend on how rows are spread over ranks.

May import: `grpo` modules below the trainer, `models`, `parallel` and the core modules.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from videogrpo import atomic
from videogrpo.errors import VideoGRPOError
from videogrpo.grpo import refiner_loss
from videogrpo.grpo.advantages import group_advantages
from videogrpo.grpo.assignment import VALIDATION_STREAM
from videogrpo.grpo.draws import counter_seed, keyed_uniforms
from videogrpo.models.refiner import Refiner, answer_text, completion_logits, sample
from videogrpo.parallel import process_groups

REWRITE_STREAM = 0x9E71
"""The counter that sets a rewrite's token draws apart from the generator's: keys of seven counters."""


def rewrite_uniforms(seed: int, batch: int, prompt: int, member: int, expert: int, count: int) -> list[float]:
    """The uniforms a rewrite's tokens are drawn at, one per token up to the cap."""
    return keyed_uniforms(count, seed, batch, prompt, member, REWRITE_STREAM, expert, 0)


@dataclass
class Rewrite:
    """One expert's rewrite of one row: what it read, what it sampled, what the next stage reads."""

    expert: str
    text_in: str
    prompt_ids: list[int]
    tokens: list[int]
    log_probs: list[float]
    """Each token's log-probability at the sampling temperature, as sampled."""
    text_out: str
    fallback: str | None
    """Why text_out is text_in: `cut` (no end-of-sequence token within the cap), `unparsed` (no answer tag, or
    empty); None: the rewrite is used."""
    image: str | None = None
    """The first frame a vision-language refiner saw beside the text (its replay shows it again)."""
    trained: bool = True
    """Whether this row trains the refiner on it: under refiners.rewrites_per_prompt a rewrite's first member does,
    the others read the same rewrite."""


@dataclass
class Expert:
    name: str
    settings: object
    """Its refiners.experts record."""
    refiner: Refiner
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None
    """The frozen copy of its initial weights the k3 KL is measured to (kl_coeff > 0 only)."""
    version: int = 0
    """Updates its weights have taken."""


class Refiners:
    """The run's refiners, in the order they rewrite."""

    def __init__(self, cfg, paths: dict[str, Path], device: torch.device):
        self.cfg = cfg
        self.experts: list[Expert] = []
        for i, settings in enumerate(cfg.refiners.experts):
            if settings.name not in paths:
                raise VideoGRPOError(
                    f"refiners.experts[{i}] ({settings.name}): no download given (the train stage's --refiner "
                    f"{settings.name}=DIR; the workflow's fetch_refiner rule makes it)"
                )
            refiner = Refiner.load(paths[settings.name], device)
            if refiner.sees_images != settings.vision:
                kind = "a vision-language model" if refiner.sees_images else "a language model alone"
                raise VideoGRPOError(
                    f"refiners.experts[{i}].vision = {str(settings.vision).lower()}, but {paths[settings.name]} is "
                    f"{kind}; set vision to {str(refiner.sees_images).lower()}, or give the refiner it names"
                )
            reference = None
            if settings.lora_rank:  # adapters on a frozen base; the KL's reference is the base (adapters off)
                refiner.model = add_adapters(refiner.model, settings, counter_seed(cfg.train.seed, REWRITE_STREAM, i))
            elif settings.kl_coeff > 0:
                reference = copy.deepcopy(refiner.model).eval().requires_grad_(False)
            refiner.model.train()
            params = [p for p in refiner.model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
            self.experts.append(Expert(settings.name, settings, refiner, params, optimizer, reference))

    # ---- rollout ---------------------------------------------------------------------------------------

    def rewrite_rows(self, batch: int, rows: list[tuple[int, int]], prompts: list[str], images: list[Path]):
        """(the text each row's generator reads, each row's rewrites in expert order: [] on original members);
        `images`: each row's first frame, which a vision-language refiner sees."""
        seed, kept = self.cfg.train.seed, self.cfg.refiners.original_members
        per_rewrite = self.cfg.grpo.group_size // (self.cfg.refiners.rewrites_per_prompt or self.cfg.grpo.group_size)
        texts, records = [], []
        for (j, g), prompt, image in zip(rows, prompts, images):
            chain = [(e.name, e.refiner, e.settings) for e in self.experts] if g >= kept else []
            # UniRL's layout: the members of a rewrite draw it alike (keyed by the rewrite), its first trains on it;
            # without it each member is a rewrite of its own (per_rewrite 1).
            r = g // per_rewrite
            mine = rewrite_chain(chain, prompt, lambda k, n, j=j, r=r: rewrite_uniforms(seed, batch, j, r, k, n), image)
            for rewrite in mine:
                rewrite.trained = g % per_rewrite == 0
            texts.append(mine[-1].text_out if mine else prompt)
            records.append(mine)
        return texts, records

    def rewrite_validation(self, indices: list[int], prompts: list[str], images: list[Path]) -> list[str]:
        """What the generator reads at a validation point: each held-out prompt rewritten by the refiners, their draws
        keyed by (seed, the validation stream, the prompt's index, the refiner): the same at every point but for the
        refiners' weights."""
        seed, chain = self.cfg.train.seed, [(e.name, e.refiner, e.settings) for e in self.experts]
        texts = []
        for i, prompt, image in zip(indices, prompts, images):

            def uniforms(k: int, n: int, i=i) -> list[float]:
                return keyed_uniforms(n, seed, VALIDATION_STREAM, i, REWRITE_STREAM, k)

            with torch.no_grad():
                rewrites = rewrite_chain(chain, prompt, uniforms, image)
            texts.append(rewrites[-1].text_out if rewrites else prompt)
        return texts

    # ---- the update ------------------------------------------------------------------------------------

    def step(self, chunks, advantages: dict[str, torch.Tensor], lr_factor: float) -> dict:
        """Each expert's loss over this rank's rewrites (a share of the batch-wide aggregate), gradients averaged
        over the ranks, its own clip, its learning rate x `lr_factor` (train.lr_schedule's shape); returns the
        metrics, reduced over the ranks."""
        world = torch.distributed.get_world_size() if process_groups.active() else 1
        metrics = {}
        for k, e in enumerate(self.experts):
            s = e.settings
            rows = [
                (row[k], float(advantages[e.name][j, g]))
                for chunk in chunks
                for j, g, row in zip(chunk.prompts, chunk.members, chunk.rewrites)
                if row and row[k].trained
            ]
            sampled = [row[k] for chunk in chunks for row in chunk.rewrites or [] if row]
            flops = self.flops(e, sampled, [r for r, _ in rows])
            counts = process_groups.reduce_floats(
                [len(rows), sum(len(r.tokens) for r, _ in rows), flops], self.device(e), "sum"
            )
            total_rows, total_tokens = max(counts[0], 1.0), max(counts[1], 1.0)
            sums = dict.fromkeys(("loss", "kl", "clipped_tokens", "advantage_abs"), 0.0)
            for rewrite, advantage in rows:
                value, kl, clipped = self._row_loss(e, rewrite, advantage)
                share = total_tokens if s.normalization == "token_mean" else total_rows
                (value * world / share).backward()
                sums["loss"] += float(value.detach()) / share
                sums["kl"] += float(kl) / share
                sums["clipped_tokens"] += float(clipped)
                sums["advantage_abs"] += abs(advantage)
            process_groups.average_gradients(e.params)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(e.params, s.max_grad_norm))
            for group in e.optimizer.param_groups:
                group["lr"] = s.lr * lr_factor
            e.optimizer.step()
            e.optimizer.zero_grad(set_to_none=True)
            e.version += 1
            reduced = process_groups.reduce_floats(list(sums.values()), self.device(e), "sum")
            loss, kl, clipped, advantage_abs = reduced
            metrics.update(
                {
                    f"refiner/{e.name}/loss": loss,
                    f"refiner/{e.name}/kl": kl,
                    f"refiner/{e.name}/clip_fraction": clipped / total_tokens,
                    f"refiner/{e.name}/advantage_abs_mean": advantage_abs / total_rows,
                    f"refiner/{e.name}/grad_norm": grad_norm,
                    f"refiner/{e.name}/learning_rate": s.lr * lr_factor,
                    f"refiner/{e.name}/version": e.version,
                    f"refiner/{e.name}/flops_per_update": counts[2],
                }
            )
        return metrics

    def _row_loss(self, e: Expert, rewrite: Rewrite, advantage: float):
        """(this rewrite's aggregate term with gradient, its KL, its clipped tokens): its tokens' mean
        (sequence_token_mean), sum (token_mean: the caller divides by the batch's tokens) or sum over the cap."""
        s = e.settings
        tokens = torch.tensor([rewrite.tokens], device=self.device(e))
        vision = e.refiner.chat(s.system_prompt, rewrite.text_in, Path(rewrite.image))[1] if rewrite.image else None
        logits = completion_logits(e.refiner.model, rewrite.prompt_ids, rewrite.tokens, vision).unsqueeze(0)
        log_probs = refiner_loss.token_log_probs(logits, tokens, s.temperature)
        reference = None
        if s.kl_coeff > 0:
            frozen = e.reference if e.reference is not None else e.refiner.model
            adapters_off = e.refiner.model.disable_adapter() if e.reference is None else contextlib.nullcontext()
            with torch.no_grad(), adapters_off:
                ref_logits = completion_logits(frozen, rewrite.prompt_ids, rewrite.tokens, vision).unsqueeze(0)
                reference = refiner_loss.token_log_probs(ref_logits, tokens, s.temperature)
        rollout = torch.tensor([rewrite.log_probs], device=tokens.device, dtype=log_probs.dtype)
        adv = torch.tensor([advantage], device=tokens.device, dtype=log_probs.dtype)
        per_token, clipped = refiner_loss.token_losses(log_probs, rollout, adv, s.loss, s.clip_range)
        kl = refiner_loss.k3_kl(log_probs, reference) if reference is not None else torch.zeros_like(log_probs)
        total = per_token + s.kl_coeff * kl
        if s.normalization == "sequence_token_mean":
            return total.mean(), kl.mean().detach(), clipped.sum()
        if s.normalization == "token_mean":
            return total.sum(), kl.sum().detach(), clipped.sum()
        return total.sum() / s.max_new_tokens, kl.sum().detach() / s.max_new_tokens, clipped.sum()

    @staticmethod
    def flops(e: Expert, sampled: list[Rewrite], trained: list[Rewrite]) -> float:
        """The refiner's FLOPs for these rewrites, by the count of 2 x its parameters (but the embedding table) per
        token of a forward: sampling (the chat, then one token at a time with the key-value cache), the replay's
        forward and backward (3 forwards' worth) and the frozen copy's forward (kl_coeff > 0)."""
        embedding = e.refiner.model.get_input_embeddings().weight
        params = sum(
            p.numel() for name, p in e.refiner.model.named_parameters() if p is not embedding and "lora_" not in name
        )
        replays = 3 + (1 if e.settings.kl_coeff > 0 else 0)
        tokens = sum(len(r.prompt_ids) + len(r.tokens) for r in sampled)
        tokens += replays * sum(len(r.prompt_ids) + len(r.tokens) for r in trained)
        return 2.0 * params * tokens

    @staticmethod
    def device(e: Expert) -> torch.device:
        return e.params[0].device

    # ---- checkpoints and export -------------------------------------------------------------------------

    def parts(self) -> dict:
        """checkpoint.Parts: each refiner's model and AdamW, as `refiner.<name>`."""
        return {f"refiner.{e.name}": (e.refiner.model, e.optimizer) for e in self.experts}

    def set_versions(self, version: int) -> None:
        """After a resume: every refiner has taken the checkpoint's updates (one step each update)."""
        for e in self.experts:
            e.version = version

    def export(self, target: Path, checkpoints: Path) -> None:
        """Each refiner as transformers saves it, model and tokenizer, under target/refiners/<name>, and the run's
        rewrites under target/rewrites/ (rank 0)."""
        import shutil

        for e in self.experts:
            folder = target / "refiners" / e.name
            if e.settings.lora_rank:  # its adapters, and the model with them merged in (what evaluation loads)
                e.refiner.model.save_pretrained(str(folder / "adapters"))
                copy.deepcopy(e.refiner.model).to("cpu").merge_and_unload().save_pretrained(str(folder))
            else:
                e.refiner.model.save_pretrained(str(folder))
            e.refiner.tokenizer.save_pretrained(str(folder))
            if e.refiner.image_processor is not None:
                e.refiner.image_processor.save_pretrained(str(folder))
        if (checkpoints / "rewrites").is_dir():
            shutil.copytree(checkpoints / "rewrites", target / "rewrites")


LORA_TARGETS = r"^(?!.*visual).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"
"""The refiner's layers that take adapters: every linear layer of its language model (not a vision tower's)."""


def add_adapters(model: torch.nn.Module, settings, seed: int) -> torch.nn.Module:
    """peft adapters of rank lora_rank (scale lora_alpha / rank) on LORA_TARGETS, the base frozen, initialised from a
    generator seeded by the run and the refiner's position, inside a fork of torch's RNG (every rank and every
    resume builds the same adapters)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.lora_rank, lora_alpha=settings.lora_alpha or settings.lora_rank, target_modules=LORA_TARGETS
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def rewrite_chain(
    chain: list[tuple[str, Refiner, object]], text: str, uniforms, image: Path | None = None
) -> list[Rewrite]:
    """`text` rewritten by each (name, refiner, its refiners.experts record) in turn, each reading the previous one's
    rewrite (a vision-language refiner seeing `image`, the first frame, too); `uniforms(k, n)`: the n uniforms
    refiner k draws its tokens at. A rewrite cut at the cap, without its answer tag or empty falls back to the text
    it rewrote."""
    found = []
    for k, (name, refiner, s) in enumerate(chain):
        seen = image if refiner.sees_images else None
        ids, vision = refiner.chat(s.system_prompt, text, seen)
        with torch.no_grad():
            tokens, log_probs = sample(
                refiner.model, ids, uniforms(k, s.max_new_tokens), s.temperature, s.top_p, refiner.eos_token_id, vision
            )
        ended = tokens[-1] == refiner.eos_token_id
        answer = answer_text(refiner.decode(tokens), s.answer_tag) if ended else None
        fallback = None if answer is not None else ("cut" if not ended else "unparsed")
        found.append(Rewrite(name, text, ids, tokens, log_probs, answer or text, fallback, str(seen) if seen else None))
        text = answer or text
    return found


def public_record(rewrite: Rewrite) -> dict:
    """A rewrite as the rewrites files hold it: what it read, its tokens, what it gave, and why it fell back (the
    first frame a vision-language refiner saw is the row's sample's, named beside it)."""
    return {k: v for k, v in asdict(rewrite).items() if k not in ("prompt_ids", "log_probs", "image")}


def advantages(cfg, table: torch.Tensor, adv: torch.Tensor, terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each refiner's [P, G] advantages: `shared` the generator's (`adv`); `per_expert` its reward term's group
    advantage, normalised as grpo's (`terms`: each reward kind's [P, G] raw scores); `hierarchical` its rewrite's
    advantage over the prompt's rewrites (refiner_loss.refiner_advantages), on each member of the rewrite."""
    g = cfg.grpo
    found = {}
    for e in cfg.refiners.experts:
        if cfg.refiners.credit == "hierarchical":
            n = cfg.refiners.rewrites_per_prompt
            by_rewrite, _ = refiner_loss.refiner_advantages(table.view(table.shape[0], n, -1), "hierarchical")
            found[e.name] = by_rewrite.repeat_interleave(table.shape[1] // n, dim=1)
        elif cfg.refiners.credit == "per_expert":
            found[e.name] = group_advantages(
                terms[e.reward_term], g.advantage_std, g.advantage_std_unbiased, g.advantage_eps
            )
        else:
            found[e.name] = adv
    return found


def generator_advantages(cfg, table: torch.Tensor) -> torch.Tensor:
    """Credit `hierarchical`: each video's [P, G] advantage over its rewrite's videos (UniRL's generator group)."""
    n = cfg.refiners.rewrites_per_prompt
    _, by_video = refiner_loss.refiner_advantages(table.view(table.shape[0], n, -1), "hierarchical")
    return by_video.reshape(table.shape)


def fallback_counts(chunks) -> dict[str, list[int]]:
    """{expert: [rewrites, cut, unparsed]} over this rank's chunks (each rewrite once: where it is trained)."""
    counts: dict[str, list[int]] = {}
    for chunk in chunks:
        for row in chunk.rewrites or []:
            for r in (r for r in row if r.trained):
                c = counts.setdefault(r.expert, [0, 0, 0])
                c[0] += 1
                c[1] += r.fallback == "cut"
                c[2] += r.fallback == "unparsed"
    return counts


def rewrites_file(checkpoints: Path, batch: int) -> Path:
    """Where a batch's rewrites are kept while training: beside the checkpoints (a resume rewrites the same ones),
    exported with the weights (`export`)."""
    return checkpoints / "rewrites" / f"batch-{batch:08d}.jsonl"


def write_rewrites(path: Path, batch: int, rows: list[dict]) -> str:
    """One batch's rewrites as JSONL (rank 0, atomic), sorted by prompt and member; returns its SHA-256."""
    import hashlib

    ordered = sorted(rows, key=lambda r: (r["prompt"], r["member"]))
    lines = [json.dumps(dict(row, batch=batch), sort_keys=True) for row in ordered]
    text = "".join(line + "\n" for line in lines)
    atomic.write_text(path, text)
    return hashlib.sha256(text.encode()).hexdigest()


def rewrite_rows_record(chunks) -> list[dict]:
    """This rank's rows as the JSONL records them: prompt, member, the prompt the generator read, each rewrite."""
    found = []
    for chunk in chunks:
        for j, g, sample_ref, row in zip(chunk.prompts, chunk.members, chunk.samples, chunk.rewrites or []):
            found.append(
                {
                    "prompt": j,
                    "member": g,
                    "task": sample_ref.task,
                    "sample": sample_ref.sample_id,
                    "original": sample_ref.prompt,
                    "generator_prompt": row[-1].text_out if row else sample_ref.prompt,
                    "rewrites": [public_record(r) for r in row],
                }
            )
    return found
