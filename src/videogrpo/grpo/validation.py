"""Validation during training (train.validate_every, train.validate_before_training; docs/options.md): the policy
samples the first train.validate_prompts prompts of the held-out split (data.heldout_per_task keeps them out of
training), one video each, and the training reward scores them (and the gold rewards beside it, train.validate_rewards:
grpo/gold_rewards.py).

Every validation point samples the same prompts from the same noise: x_T, each SDE step's eps and a drawn noise
level are keyed by (train.seed, `assignment.VALIDATION_STREAM`, prompt, step), never drawn from a generator's state,
so points differ by the weights alone, and a resumed run validates exactly as an uninterrupted one. The sampler is
train.validate_sampler, a matrix sampler name (`denoise`: an ODE scheduler or a transition of training), over
training's sampling steps, flow shift, guidance and video shape. The prompts are dealt over the data replicas
(prompt i to replica i mod R), each replica padded with repeats to the same count, so every rank runs the same
forwards (FSDP's collectives go in lockstep) and TP peers sample the same rows; a repeat is sampled and dropped.

Training does not see it: the policy is in eval mode and back in its own mode after, the global RNG state is
restored (nothing here draws from it, and nothing may), the prompt cache is bypassed (held-out prompts must not
evict training's), the frozen models go back to where the update left them (`offload.Placement`), and the scores
are gathered to every rank but enter no advantage.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from videogrpo.config.cells import parse_sampler
from videogrpo.data.dataset import SampleRef, load_split
from videogrpo.errors import ConfigError
from videogrpo.grpo import assignment, denoise, gold_rewards, offload
from videogrpo.grpo.draws import seeded_normal, seeded_uniform
from videogrpo.parallel import process_groups
from videogrpo.provenance.metric_rows import VALIDATION_PREFIX as VAL
from videogrpo.rewards.rule import score_request


def due(cfg, update: int, total: int) -> bool:
    """Whether update `update` (of `total`) is followed by a validation point: every train.validate_every, and
    the last."""
    every = cfg.train.validate_every
    return every > 0 and (update % every == 0 or update == total)


def before_training(cfg, start: int) -> bool:
    """Whether to validate at update 0: asked for, and the run starts fresh (a resumed run has its point 0)."""
    return cfg.train.validate_before_training and start == 0


def prompts(cfg, dataset) -> list[SampleRef]:
    """The first train.validate_prompts samples of the held-out split, in its (task-grouped) order."""
    held = load_split(dataset, "heldout")
    if not held:
        raise ConfigError(
            f"train.validate_every = {cfg.train.validate_every}, train.validate_before_training = "
            f"{cfg.train.validate_before_training}: the dataset {dataset} holds no held-out sample to validate on; "
            f"set data.heldout_per_task above 0 (and rebuild the dataset), or turn validation off"
        )
    return held[: cfg.train.validate_prompts]


def replica_share(count: int, replicas: int, replica: int) -> list[int]:
    """The prompt indices data replica `replica` of `replicas` samples: i = replica mod replicas, then -1 (a repeat
    of prompt 0, dropped) up to ceil(count / replicas), the share of the busiest replica."""
    mine = list(range(replica, count, replicas))
    return mine + [-1] * (-(-count // replicas) - len(mine))


def _how(trainer, sampler, rows: list[int]):
    """`denoise`'s sampler of `rows`: an ODE scheduler at training's flow shift, or training's transition with
    step noise (and a drawn noise level) keyed by prompt."""
    seed, dev, shape = trainer.cfg.train.seed, trainer.ctx.device, trainer.shape
    if sampler.kind in ("unipc", "euler"):  # a new scheduler per forward: UniPC keeps state between its steps
        scheduler = denoise.ode_scheduler(sampler.kind, trainer.paths.model, trainer.shift)
        return denoise.ODE(scheduler, trainer.cfg.grpo.sampling_steps)
    if sampler.kind == "dpm_solver":
        return denoise.Solver(trainer.sigmas)
    eta: float | torch.Tensor = sampler.noise
    if sampler.noise_range is not None:
        keys = [assignment.validation_noise_key(seed, i, assignment.ETA_STREAM) for i in rows]
        eta = torch.tensor([seeded_uniform(*sampler.noise_range, *key) for key in keys], device=dev)

    def step_noise(k: int) -> torch.Tensor:
        return torch.stack([seeded_normal(shape, dev, *assignment.validation_noise_key(seed, i, k)) for i in rows])

    return denoise.SDE(sampler.kind, trainer.sigmas, eta, step_noise)


def _sample_and_submit(trainer, samples: list[SampleRef], share: list[int]) -> list:
    """Sample this rank's share in training's rollout chunk size; on a scoring rank, submit the real rows' videos to
    the scorer. Returns the futures with their prompt indices."""
    cfg, model, dev, seed = trainer.cfg, trainer.model, trainer.ctx.device, trainer.cfg.train.seed
    v = cfg.video
    rows = [max(i, 0) for i in share]  # a repeat samples prompt 0
    chosen = [samples[i] for i in rows]
    sampler = parse_sampler(cfg.train.validate_sampler)
    weights = trainer.experts.policy
    per_forward = len(offload.rollout_chunks(trainer.waves[0], cfg.grpo.sample_batch_size)[0])
    texts = [s.prompt for s in chosen]
    if trainer.refiners is not None:  # the trained refiners rewrite them first, their draws keyed by the prompt
        texts = trainer.refiners.rewrite_validation(rows, texts, [s.first_frame for s in chosen])
    trainer.placement.enter("encode")
    embeds, condition = model.encode_conditions(
        texts, [s.first_frame for s in chosen], v.height, v.width, v.num_frames, cached=False
    )
    trainer.placement.enter("rollout")
    latents = []
    for at in range(0, len(rows), per_forward):
        part = rows[at : at + per_forward]
        init = torch.stack(
            [
                seeded_normal(trainer.shape, dev, *assignment.validation_noise_key(seed, i, assignment.X_T_STEP))
                for i in part
            ]
        )
        how = _how(trainer, sampler, part)
        latents.append(
            denoise.sample_latents(
                model,
                weights,
                embeds[at : at + per_forward],
                condition[at : at + per_forward],
                init,
                how,
                cfg.grpo.guidance_scale,
            )
        )
    if not trainer.scores:  # a TP peer: its tp_rank 0 decodes and scores the same rows
        return []
    real = [k for k, i in enumerate(share) if i >= 0]
    trainer.placement.enter("decode")
    videos = offload.decode_in_batches(model.decode, torch.cat(latents)[real], cfg.grpo.decode_batch_size)
    submitted = []
    for k, video in zip(real, videos):
        request = score_request(cfg.evalkit, v.fps, video, chosen[k].task, str(chosen[k].directory))
        gold = {kind: scorer.submit(request) for kind, scorer in trainer.gold_scorers.items()}
        submitted.append((share[k], trainer.scorer.submit(request), gold))
    return submitted


def validate(trainer, update: int) -> dict:
    """One validation point after update `update` (0: before training), a metrics record of `val/*` keys, the same
    on every rank. Collective: every rank calls it at the same point."""
    t0 = time.monotonic()
    cfg, ctx = trainer.cfg, trainer.ctx
    samples = prompts(cfg, trainer.paths.dataset)
    share = replica_share(
        len(samples), trainer.experts.replicas(ctx.world_size), ctx.rank // cfg.parallel.tensor_parallel
    )
    weights = trainer.experts.policy
    modules = list(weights.values()) if isinstance(weights, dict) else [weights]
    modes = [module.training for module in modules]
    phase = trainer.placement.phase
    with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []):
        for module in modules:
            module.eval()
        try:
            submitted = _sample_and_submit(trainer, samples, share)
        finally:
            for module, mode in zip(modules, modes):
                module.train(mode)
            trainer.placement.enter(phase)  # where the update left the frozen models (replay: on the host)
    results = trainer.scorer.collect([future for _, future, _ in submitted])
    gold = gold_rewards.collect(
        trainer.gold_scorers,
        {kind: [futures[kind] for *_, futures in submitted] for kind in trainer.gold_scorers},
        cfg.train.validate_rewards_fail_on_error,
    )
    mine = [
        (i, float(r["score"]), samples[i].task, bool(r.get("error")), {k: g if isinstance(g, str) else g[n]
                                                                        for k, g in gold.items()})
        for n, ((i, *_), r) in enumerate(zip(submitted, results))
    ]  # fmt: skip
    everyone = sorted((row for part in process_groups.all_gather_objects(mine) for row in part), key=lambda r: r[0])
    if [i for i, *_ in everyone] != list(range(len(samples))):
        raise RuntimeError(
            f"validation at update {update}: scores of prompts {[i for i, *_ in everyone]}, not each of "
            f"0..{len(samples) - 1} once (the replicas' shares and the scoring ranks disagree)"
        )
    scores = np.array([score for _, score, *_ in everyone], dtype=np.float64)
    per_task: dict[str, list[float]] = {}
    for _, score, task, *_ in everyone:
        per_task.setdefault(task, []).append(score)
    record = {
        "step": update,
        f"{VAL}reward_mean": float(scores.mean()),
        f"{VAL}reward_std": float(scores.std()),  # over the prompts (population: one prompt has 0, not NaN)
        f"{VAL}reward_per_task": {task: float(np.mean(values)) for task, values in sorted(per_task.items())},
        f"{VAL}reward_errors": sum(row[3] for row in everyone),
        f"{VAL}prompts": len(samples),
    }
    if cfg.train.validate_rewards:  # the gold rewards, and the training reward's per-prompt scores the alarm pairs
        tasks = [task for _, _, task, *_ in everyone]
        trained = [None if error else score for _, score, _, error, _ in everyone]
        record.update({key: value for key, value in gold_rewards.summary(VAL, trained, tasks).items()
                       if key in (f"{VAL}reward_stderr", f"{VAL}{gold_rewards.SCORES}")})  # fmt: skip
        record[f"{VAL}{gold_rewards.TASKS}"] = tasks
        for kind in cfg.train.validate_rewards:
            failed = sorted({row[4][kind] for row in everyone if isinstance(row[4][kind], str)})
            if failed:  # its scorer failed on some rank: this point has no numbers of it
                record[f"{VAL}{kind}/failed"] = "; ".join(failed)
            else:
                record.update(gold_rewards.summary(f"{VAL}{kind}/", [row[4][kind] for row in everyone], tasks))
    record[f"{VAL}time_s"] = time.monotonic() - t0
    return record
