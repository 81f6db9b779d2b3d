"""The raw compute of training updates, for the overhead comparison in bench_trainer.py (run under torchrun).

The same rollouts (conditions, denoising loop, decode) and the same forward/backward passes over the
trained timesteps, gradient all-reduce and optimizer step as the trainer, with nothing else: no
rewards, no gathering, no statistics, no logging. Prints {"step_s": median seconds per update}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    from videogrpo import config, distributed
    from videogrpo.data.dataset import batch_for_step, load_split, training_order
    from videogrpo.grpo.rollout import replay_log_prob, rollout, seeded_normal, trained_timesteps
    from videogrpo.grpo.samplers import sigma_schedule
    from videogrpo.grpo.trainer import waves
    from videogrpo.models.wan import WanTI2V

    parser = argparse.ArgumentParser()
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--updates", type=int, required=True)
    args = parser.parse_args()
    cfg = config.from_dict(json.loads(args.config_json))
    ctx = distributed.init("cpu", "gloo", cfg.parallel.cpu_threads)
    model = WanTI2V(args.model, ctx.device, max_text_tokens=cfg.model.max_text_tokens)
    params = list(model.transformer.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr)
    order = training_order(load_split(args.dataset, "rl"), cfg.data.shuffle_seed)
    sigmas = sigma_schedule(cfg.grpo.sampling_steps, cfg.grpo.shift)
    shape = model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width).shape
    rows = waves(cfg, ctx.rank, ctx.world_size)[0]
    times = []
    for step in range(args.updates):
        t0 = time.monotonic()
        _, prompts = batch_for_step(order, cfg.grpo.prompts_per_step, step)
        samples = [prompts[j] for j, _ in rows]
        embeds, condition = model.encode_conditions([s.prompt for s in samples], [s.first_frame for s in samples],
                                                    cfg.video.height, cfg.video.width)
        init = torch.stack([seeded_normal(shape, ctx.device, 0, step, j, 0) for j, _ in rows])
        etas = torch.full((len(rows),), cfg.grpo.eta)
        traj = rollout(model, model.transformer, embeds, condition, init, sigmas, cfg.grpo.sampler, etas,
                       lambda i: torch.stack([seeded_normal(shape, ctx.device, 0, step, j, g, i) for j, g in rows]))
        model.decode(traj.latents[:, -1])
        timesteps = trained_timesteps(cfg.grpo.sampling_steps, cfg.grpo.timestep_fraction, 0, step + 1)
        advantages = torch.ones(len(rows))
        for index in timesteps:
            logp, _ = replay_log_prob(model, model.transformer, traj, index, sigmas, cfg.grpo.sampler, embeds)
            (-(advantages * logp).mean() / len(timesteps)).backward()
        distributed.average_gradients(params)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.monotonic() - t0)
    if ctx.is_main:
        print(json.dumps({"step_s": statistics.median(times[2:])}))
    distributed.shutdown()


if __name__ == "__main__":
    main()
