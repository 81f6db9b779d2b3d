"""The same work as a synchronous training update, in a plain loop, for the overhead comparison in bench_trainer.py.

Run under torchrun. Per update, exactly what the trainer's synchronous update does: conditions,
the rollouts of this rank's rows with the trainer's counter-seeded noise, decoding, scoring through
the same scorer pool (submit, then collect), gathering every rank's rewards, group advantages, the
PPO loss over the trained timesteps with backward, gradient all-reduce, clipping and the AdamW step,
timed in the same three windows as the trainer's metrics (rollout, reward wait, replay). Nothing else:
no plan, no tracker, no metric reductions, no checkpoints. Prints one JSON line per update.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    from videogrpo import config
    from videogrpo.data.dataset import batch_for_step, load_split, training_order
    from videogrpo.grpo.advantages import group_advantages
    from videogrpo.grpo.assignment import waves
    from videogrpo.grpo.draws import seeded_normal
    from videogrpo.grpo.loss import ppo_loss
    from videogrpo.grpo.rollout import replay_log_prob, rollout
    from videogrpo.grpo.samplers import sigma_schedule
    from videogrpo.grpo.sde_window import trained_timesteps
    from videogrpo.models.wan import WanTI2V, flow_shift
    from videogrpo.parallel import process_groups
    from videogrpo.rewards.rule import RuleScorer, score_request

    parser = argparse.ArgumentParser()
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--evalkit", type=Path, required=True)
    parser.add_argument("--updates", type=int, required=True)
    args = parser.parse_args()
    cfg = config.from_dict(json.loads(args.config_json))
    g, seed = cfg.grpo, cfg.train.seed
    ctx = process_groups.init("cpu", "gloo", cfg.parallel.cpu_threads)
    model = WanTI2V.from_config(args.model, ctx.device, cfg)
    params = list(model.transformer.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    order = training_order(load_split(args.dataset, "rl"), cfg.data.shuffle_seed)
    sigmas = sigma_schedule(g.sampling_steps, flow_shift(cfg, args.model)[0])
    shape = model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width).shape
    rows = waves(cfg, ctx.rank, ctx.world_size)[0]
    scorer = RuleScorer.for_config(cfg, args.evalkit)
    try:
        for step in range(args.updates):
            t0 = time.monotonic()
            _, prompts = batch_for_step(order, g.prompts_per_step, step)
            samples = [prompts[j] for j, _ in rows]
            embeds, condition = model.encode_conditions(
                [s.prompt for s in samples], [s.first_frame for s in samples], cfg.video.height, cfg.video.width
            )
            init = torch.stack([seeded_normal(shape, ctx.device, seed, step, j, 0, 0x1A17) for j, _ in rows])
            etas = torch.full((len(rows),), g.eta)
            with torch.no_grad():
                traj = rollout(
                    model,
                    model.transformer,
                    embeds,
                    condition,
                    init,
                    sigmas,
                    g.sampler,
                    etas,
                    lambda i, step=step: torch.stack(
                        [seeded_normal(shape, ctx.device, seed, step, j, m, i) for j, m in rows]
                    ),
                )
            futures = [
                scorer.submit(score_request(cfg.evalkit, cfg.video.fps, video, s.task, str(s.directory)))
                for video, s in zip(model.decode(traj.latents[:, -1]), samples)
            ]
            t1 = time.monotonic()
            mine = [(j, m, r["score"]) for (j, m), r in zip(rows, scorer.collect(futures))]
            table = torch.zeros(g.prompts_per_step, g.group_size)
            for part in process_groups.all_gather_objects(mine):
                for j, m, score in part:
                    table[j, m] = score
            advantages = group_advantages(table)
            advantages = torch.stack([advantages[j, m] for j, m in rows])
            t2 = time.monotonic()
            timesteps = trained_timesteps(g.sampling_steps, g.timestep_fraction, seed, step + 1)
            scale = ctx.world_size / (len(timesteps) * g.group_size * g.prompts_per_step)
            for index in timesteps:
                new = replay_log_prob(model, model.transformer, traj, index, sigmas, g.sampler, embeds)
                loss, _ = ppo_loss(new.log_prob, traj.log_probs[:, index], advantages, g.clip_range)
                (loss * len(rows) * scale).backward()
            process_groups.average_gradients(params)
            torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            t3 = time.monotonic()
            if ctx.is_main:
                print(
                    json.dumps(
                        {
                            "time_rollout_s": t1 - t0,
                            "time_reward_wait_s": t2 - t1,
                            "time_replay_s": t3 - t2,
                            "time_step_s": t3 - t0,
                        }
                    ),
                    flush=True,
                )
    finally:
        scorer.close()
        process_groups.shutdown()


if __name__ == "__main__":
    main()
