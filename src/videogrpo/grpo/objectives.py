"""The per-step objectives an update replays, one function per grpo.algorithm: GRPO's clipped PPO term on a recorded
transition's log-prob (with GRPO-Guard's normalised ratio as an option), and DiffusionNFT's forward-process term on
a freshly noised clean latent. Each returns (loss, KL term, diagnostics) for a slice of a rollout chunk's rows; the
trainer (`trainer.Trainer`, passed in) owns the weights, the sigmas and the placement of the trajectories.
`replay_update` runs them over the forwards of one optimizer update (`minibatches`) and backpropagates.

May import what `grpo` may, and the `grpo` modules below the trainer.
"""

from __future__ import annotations

import torch

from videogrpo.grpo import minibatches, nft
from videogrpo.grpo.draws import seeded_normal
from videogrpo.grpo.loss import guard_log_ratio, ppo_loss
from videogrpo.grpo.rollout import frame_mask, replay_log_prob, velocity
from videogrpo.grpo.samplers import kl_divergence, masked_mean


def grpo_terms(trainer, chunk, at: list[int], index: int, embeds, condition, clip: float, keep):
    """(PPO loss, KL, diagnostics) of recorded transition `index` of the chunk's rows `at`."""
    g, sigmas = trainer.cfg.grpo, trainer.sigmas[index : index + 2]
    policy, reference = trainer.experts.policy, trainer.experts.reference
    step = trainer.placement.transition(chunk.trajectory, index, at)  # transition `index` as its index 0
    new = replay_log_prob(trainer.model, policy, step, 0, sigmas, g.sampler, embeds, g.guidance_scale, condition)
    mask = frame_mask(new.mean.shape[2], new.mean.device, trainer.model.pins_first_frame)
    if g.grpo_guard:  # the normalised ratio, and the step's loss reweighted by 1 / (sigma - sigma')
        per_row = g.grpo_guard_scope == "row"  # else over the replay forward's rows, as its authors' code
        log_ratio = guard_log_ratio(
            new.log_prob, step.log_probs[:, 0], new.mean, step.means[:, 0], new.std, mask, per_row=per_row
        )
        loss, stats = ppo_loss(log_ratio, torch.zeros_like(log_ratio), chunk.advantages[at], clip, g.clip_range_high)
        loss = loss / float(sigmas[0] - sigmas[1])
    else:
        loss, stats = ppo_loss(new.log_prob, step.log_probs[:, 0], chunk.advantages[at], clip, g.clip_range_high)
    kl = torch.zeros((), device=loss.device)
    if reference is not None:
        with torch.no_grad():
            ref = replay_log_prob(
                trainer.model, reference, step, 0, sigmas, g.sampler, embeds, g.guidance_scale, condition
            )
        if keep is None:
            kl = kl_divergence(g.sampler, new.mean, ref.mean, new.std, mask)
        elif keep:
            std = new.std if new.std.numel() == 1 else new.std[keep]
            kl = kl_divergence(g.sampler, new.mean[keep], ref.mean[keep], std, mask)
    terms = {
        "ppo_ratio_mean": stats.ratio_mean,
        "ppo_clip_fraction": stats.clip_fraction,
        "ppo_approx_kl": stats.approx_kl,
        "ratio_abs_max": stats.ratio_abs_max,
    }
    return loss, kl, terms


def nft_terms(trainer, batch: int, chunk, at: list[int], index: int, embeds, condition, pass_index: int = 0):
    """(DiffusionNFT loss, KL, diagnostics) of the chunk's rows `at` at sampling sigma `index`: each row's clean
    latent noised afresh (keyed by batch, prompt, member and step, and by the pass after the first: each pass over
    a batch draws its own noise, as its authors' inner epochs), the old policy's velocity beside the trained one's,
    and the KL term the velocities' mean squared difference to the reference's."""
    g, dev = trainer.cfg.grpo, trainer.ctx.device
    sigma = float(trainer.sigmas[index])
    x0 = trainer.placement.final(chunk.trajectory, at).float()
    key = (trainer.cfg.train.seed, nft.NOISE_TAG, batch, *((nft.PASS_TAG, pass_index) if pass_index else ()))
    eps = torch.stack([seeded_normal(trainer.shape, dev, *key, chunk.prompts[i], chunk.members[i], index) for i in at])
    xt = nft.noised(x0, sigma, eps)
    mask = frame_mask(x0.shape[2], dev, trainer.model.pins_first_frame)
    if trainer.model.pins_first_frame:  # the condition frame stays clean, as in every rollout state
        xt[:, :, :1] = x0[:, :, :1]
    x = xt.to(trainer.model.trajectory_dtype)
    with torch.no_grad(), trainer.nft_old.swapped_in():
        v_old = velocity(trainer.model, trainer.experts.policy, x, sigma, embeds, g.guidance_scale, condition)
    v = velocity(trainer.model, trainer.experts.policy, x, sigma, embeds, g.guidance_scale, condition)
    loss, stats = nft.nft_loss(
        v, v_old, xt, x0, sigma, chunk.advantages[at], g.nft_beta, g.nft_adv_clip, frame_mask=mask
    )
    kl = torch.zeros((), device=loss.device)
    if trainer.experts.reference is not None:
        with torch.no_grad():
            v_ref = velocity(trainer.model, trainer.experts.reference, x, sigma, embeds, g.guidance_scale, condition)
        kl = masked_mean((v.float() - v_ref.float()) ** 2, mask).mean()
    terms = {
        "nft_positive_loss": stats.positive_loss,
        "nft_negative_loss": stats.negative_loss,
        "nft_optimality_mean": stats.optimality_mean,
    }
    return loss, kl, terms


def replay_update(
    trainer, prepared, rows, pass_index: int, timesteps: list[int], clip: float, skipped, sums: dict
) -> float:
    """Backward of one optimizer update's loss: every trained step of `rows` (None: the whole batch) of this rank,
    one backward per forward, scaled so the gradient is the mean over the set's (kept) rows x steps over every data
    replica. Adds each term x rows to `sums`; returns the largest |ratio| seen (GRPO)."""
    cfg, g = trainer.cfg, trainer.cfg.grpo
    world = trainer.ctx.world_size
    members = rows if rows is not None else minibatches.batch_rows(g)
    kept = len(members) if skipped is None else sum(1 for j, _ in members if not skipped[j])
    # Each rollout's loss counts once per trained timestep in a mean over |T| x rows terms; FSDP and the all-reduce
    # average gradients over the data replicas (the ranks, or under TP the TP pairs, whose peers compute one
    # replica's loss together), hence the replica count. A set with no kept row trains nothing (0).
    normalizer = len(timesteps) * kept
    grad_scale = trainer.experts.replicas(world) / normalizer if normalizer else 0.0
    forwards = minibatches.rank_forwards(cfg, trainer.waves, world, rows)
    nft_run = g.algorithm == "nft"
    ratio_abs_max = 0.0
    for index in timesteps:
        # One backward per forward (grpo.sample_batch_size members of each prompt), scaled by its rows.
        for forward in forwards:
            chunk, at = prepared.chunks[forward.chunk], forward.at
            n = len(at)
            embeds = chunk.embeds[at].to(trainer.ctx.device)
            condition = None if chunk.condition is None else chunk.condition[at].to(trainer.ctx.device)
            # A skipped group's rows (advantage 0: no policy term) are replayed still, every rank running the
            # same forwards; they are left out of the KL term.
            keep = None if skipped is None else [k for k, i in enumerate(at) if not skipped[chunk.prompts[i]]]
            if nft_run:
                loss, kl, terms = nft_terms(trainer, prepared.batch, chunk, at, index, embeds, condition, pass_index)
            else:
                loss, kl, terms = grpo_terms(trainer, chunk, at, index, embeds, condition, clip, keep)
                largest = terms.pop("ratio_abs_max")
                if forward.weight:
                    ratio_abs_max = max(ratio_abs_max, largest)
            if keep is None:
                ((loss + g.kl_coeff * kl) * n * grad_scale * forward.weight).backward()
            else:
                ((loss * n + g.kl_coeff * kl * len(keep)) * grad_scale * forward.weight).backward()
            if forward.weight:
                for key, value in (("policy_loss", loss.item()), ("kl_loss", kl.item()), *terms.items()):
                    sums[key] += value * n
    return ratio_abs_max
