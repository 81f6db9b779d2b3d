"""The GRPO training loop that runs on every torchrun rank.

One optimizer update: every rank reads the whole global batch of prompts, rolls out its share of
each prompt's group (shared-prompt waves or whole groups per data replica), decodes the videos and
submits them to the reward pool; rewards of every group are gathered from all ranks holding part of
it; group-relative advantages weight a PPO-clipped loss over a seeded subset of the recorded
timesteps; gradients are averaged over ranks. Checkpoints every `save_steps` and at the end.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from videogrpo import atomic, checkpoint, distributed
from videogrpo.config import Config, to_dict
from videogrpo.data.dataset import SampleRef, batch_for_step, load_split, steps_per_epoch, training_order
from videogrpo.errors import ConfigError
from videogrpo.grpo import assignment
from videogrpo.grpo.advantages import group_advantages
from videogrpo.grpo.loss import ppo_loss
from videogrpo.grpo.rollout import (Trajectory, replay_log_prob, rollout, seeded_normal, seeded_uniform,
                                    trained_timesteps)
from videogrpo.grpo.samplers import masked_mean, sigma_schedule
from videogrpo.models.wan import WanTI2V, load_first_frames
from videogrpo.rewards.rule import RuleScorer, ScoreRequest


@dataclass
class TrainPaths:
    model: Path
    dataset: Path
    evalkit: Path | None
    checkpoints: Path
    final: Path
    metrics: Path
    run_dir: Path


@dataclass
class LocalRollout:
    """This rank's rollouts of one update: which (prompt, member) each row is, and what was recorded."""

    prompts: list[int]
    members: list[int]
    samples: list[SampleRef]
    trajectory: Trajectory
    embeds: torch.Tensor


def local_work(cfg: Config, rank: int, world: int) -> list[tuple[int, tuple[int, ...]]]:
    """(global prompt index, group indices) this rank rolls out in one update, over all waves."""
    p = cfg.grpo
    if p.shared_prompts:
        wave = p.prompts_per_wave or p.prompts_per_step
        work = assignment.shared_prompt_work(rank, world, wave, p.group_size)
        return [(w * wave + slot, work.group_indices) for w in range(p.prompts_per_step // wave)
                for slot in work.prompt_slots]
    work = assignment.replica_work(rank, cfg.parallel.tensor_parallel, cfg.train.batch_size, p.group_size)
    return [(slot, work.group_indices) for slot in work.prompt_slots]


def total_updates(cfg: Config, num_samples: int) -> int:
    planned = cfg.train.epochs * steps_per_epoch(num_samples, cfg.grpo.prompts_per_step)
    return min(planned, cfg.train.max_steps) if cfg.train.max_steps else planned


class Trainer:
    def __init__(self, cfg: Config, paths: TrainPaths, ctx: distributed.Context, run_id: str):
        if cfg.parallel.data_parallel != "replicate" or cfg.parallel.tensor_parallel != 1:
            raise ConfigError(f"parallel.data_parallel = {cfg.parallel.data_parallel!r}, tensor_parallel = "
                              f"{cfg.parallel.tensor_parallel}: this trainer implements 'replicate' with "
                              f"tensor_parallel 1 so far")
        if cfg.grpo.delayed_replay:
            raise ConfigError("grpo.delayed_replay = true: not implemented in this trainer yet; set it to false")
        if cfg.reward.kind != "vbvr_rule":
            raise ConfigError(f"reward.kind = {cfg.reward.kind!r}: this trainer implements 'vbvr_rule' so far")
        self.cfg, self.paths, self.ctx, self.run_id = cfg, paths, ctx, run_id
        torch.manual_seed(cfg.train.seed + ctx.rank)
        self.model = WanTI2V(paths.model, ctx.device, cfg.parallel.param_dtype, cfg.parallel.attention_backend,
                             cfg.model.max_text_tokens, cfg.model.kind)
        self.transformer = self.model.transformer
        self.transformer.train()
        if cfg.train.gradient_checkpointing:
            self.transformer.enable_gradient_checkpointing()
        self.reference = None
        if cfg.grpo.kl_coeff > 0:
            import copy

            self.reference = copy.deepcopy(self.transformer).eval().requires_grad_(False)
        self.params = [p for p in self.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        warmup = cfg.train.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        self.order = training_order(load_split(paths.dataset, "rl"), cfg.data.shuffle_seed)
        self.total = total_updates(cfg, len(self.order))
        self.sigmas = sigma_schedule(cfg.grpo.sampling_steps, cfg.grpo.shift)
        self.geometry = self.model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width)
        self.negative = None
        if cfg.grpo.guidance_scale != 1.0:
            self.negative = self.model.encode_prompts([""])
        self.scorer = RuleScorer(paths.evalkit, cfg.evalkit.workers, cfg.evalkit.threads_per_worker)
        self.wandb = None

    # ---- one update -------------------------------------------------------------------------------

    def _rollout(self, step: int, batch: list[SampleRef]) -> LocalRollout:
        cfg, dev = self.cfg, self.ctx.device
        rows = [(j, g) for j, members in local_work(cfg, self.ctx.rank, self.ctx.world_size) for g in members]
        prompts = [j for j, _ in rows]
        members = [g for _, g in rows]
        samples = [batch[j] for j in prompts]
        embeds = self.model.encode_prompts([s.prompt for s in samples])
        frames = load_first_frames([s.first_frame for s in samples], cfg.video.height, cfg.video.width)
        condition = self.model.encode_first_frames(frames)
        shape = self.geometry.shape
        seed = cfg.train.seed
        init = torch.stack([
            seeded_normal(shape, dev, seed, step, j, 0 if cfg.grpo.share_group_noise else g + 1, 0x1A17)
            for j, g in rows])
        if cfg.grpo.eta_range:
            lo, hi = cfg.grpo.eta_range
            etas = torch.tensor([seeded_uniform(lo, hi, seed, step, j, 0xE7A) for j in prompts], device=dev)
        else:
            etas = torch.full((len(rows),), cfg.grpo.eta, device=dev)

        def step_noise(i: int) -> torch.Tensor:
            return torch.stack([seeded_normal(shape, dev, seed, step, j, g, i) for j, g in rows])

        trajectory = rollout(self.model, self.transformer, embeds, condition, init, self.sigmas, cfg.grpo.sampler,
                             etas, step_noise, cfg.grpo.guidance_scale, self._negative(len(rows)))
        return LocalRollout(prompts, members, samples, trajectory, embeds)

    def _negative(self, n: int) -> torch.Tensor | None:
        return None if self.negative is None else self.negative.expand(n, -1, -1)

    def _submit_rewards(self, local: LocalRollout) -> list:
        cfg = self.cfg
        videos = self.model.decode(local.trajectory.latents[:, -1])
        return [self.scorer.submit(ScoreRequest(video, s.task, str(s.directory), cfg.video.fps,
                                                cfg.evalkit.video_size, cfg.evalkit.max_seconds, cfg.evalkit.crf,
                                                cfg.evalkit.unsupported_score))
                for video, s in zip(videos, local.samples)]

    def _advantages(self, local: LocalRollout, results: list[dict]) -> tuple[torch.Tensor, dict]:
        mine = [(j, g, r["score"], s.task) for j, g, r, s in zip(local.prompts, local.members, results, local.samples)]
        everyone = [row for part in distributed.all_gather_objects(mine) for row in part]
        table = torch.full((self.cfg.grpo.prompts_per_step, self.cfg.grpo.group_size), float("nan"))
        for j, g, score, _ in everyone:
            table[j, g] = score
        if torch.isnan(table).any():
            raise RuntimeError("some group members got no reward: the rank assignment does not cover every group")
        adv = group_advantages(table)
        local_adv = torch.stack([adv[j, g] for j, g in zip(local.prompts, local.members)]).to(self.ctx.device)
        per_task: dict[str, list[float]] = {}
        for _, _, score, task in everyone:
            per_task.setdefault(task, []).append(score)
        stats = {"reward_mean": table.mean().item(), "reward_std": table.std().item(),
                 "advantage_mean": adv.mean().item(),
                 "reward_per_task": {t: float(np.mean(v)) for t, v in sorted(per_task.items())}}
        return local_adv, stats

    def _replay(self, step: int, local: LocalRollout, advantages: torch.Tensor) -> dict:
        cfg = self.cfg
        timesteps = trained_timesteps(cfg.grpo.sampling_steps, cfg.grpo.timestep_fraction, cfg.train.seed, step)
        clip = cfg.grpo.clip_range
        sums = {"policy_loss": 0.0, "kl_loss": 0.0, "ppo_ratio_mean": 0.0, "ppo_clip_fraction": 0.0,
                "ppo_approx_kl": 0.0}
        ratio_abs_max = 0.0
        negative = self._negative(len(local.prompts))
        for index in timesteps:
            logp, mean = replay_log_prob(self.model, self.transformer, local.trajectory, index, self.sigmas,
                                         cfg.grpo.sampler, local.embeds, cfg.grpo.guidance_scale, negative)
            loss, stats = ppo_loss(logp, local.trajectory.log_probs[:, index], advantages, clip)
            kl = torch.zeros((), device=loss.device)
            if self.reference is not None:
                with torch.no_grad():
                    _, ref_mean = replay_log_prob(self.model, self.reference, local.trajectory, index, self.sigmas,
                                                  cfg.grpo.sampler, local.embeds, cfg.grpo.guidance_scale, negative)
                mask = torch.ones(mean.shape[2], device=mean.device)
                mask[0] = 0
                kl = masked_mean((mean - ref_mean) ** 2, mask).mean()
            ((loss + cfg.grpo.kl_coeff * kl) / len(timesteps)).backward()
            sums["policy_loss"] += loss.item() / len(timesteps)
            sums["kl_loss"] += kl.item() / len(timesteps)
            sums["ppo_ratio_mean"] += stats.ratio_mean / len(timesteps)
            sums["ppo_clip_fraction"] += stats.clip_fraction / len(timesteps)
            sums["ppo_approx_kl"] += stats.approx_kl / len(timesteps)
            ratio_abs_max = max(ratio_abs_max, stats.ratio_abs_max)
        distributed.average_gradients(self.params)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.train.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return dict(sums, ppo_ratio_abs_max=ratio_abs_max, ppo_clip_range=clip, grad_norm=float(grad_norm),
                    learning_rate=lr, trained_timesteps=len(timesteps))

    def train_step(self, step: int) -> dict:
        t0 = time.monotonic()
        epoch, batch = batch_for_step(self.order, self.cfg.grpo.prompts_per_step, step)
        local = self._rollout(step, batch)
        futures = self._submit_rewards(local)
        t1 = time.monotonic()
        results = self.scorer.collect(futures)
        t2 = time.monotonic()
        advantages, reward_stats = self._advantages(local, results)
        update = self._replay(step, local, advantages)
        t3 = time.monotonic()
        peak = torch.cuda.max_memory_allocated() if self.ctx.device.type == "cuda" else 0
        return dict(step=step + 1, epoch=epoch, **reward_stats, **update, delayed_replay_staleness=0,
                    peak_memory_bytes=peak, time_rollout_s=t1 - t0, time_reward_s=t2 - t1,
                    time_replay_s=t3 - t2, time_step_s=t3 - t0)

    # ---- the run -----------------------------------------------------------------------------------

    def _resume(self) -> int:
        cfg = self.cfg
        latest = checkpoint.latest_complete(self.paths.checkpoints) if cfg.train.auto_resume else None
        if latest is not None:
            state = checkpoint.load(latest, self.transformer, self.optimizer, self.ctx.rank)
            self.scheduler.load_state_dict(state["scheduler"])
            self._log(f"resumed from {latest} (update {state['step']} of {self.total})")
            return state["step"]
        if cfg.train.resume_from:
            source = Path(cfg.train.resume_from)
            state = checkpoint.load(source, self.transformer, None if cfg.train.reset_dataloader else self.optimizer,
                                    self.ctx.rank, restore_rng=not cfg.train.reset_dataloader)
            self._log(f"initialised from {source} ({'weights only' if cfg.train.reset_dataloader else 'full state'})")
            if not cfg.train.reset_dataloader:
                self.scheduler.load_state_dict(state["scheduler"])
                return state["step"]
        return 0

    def _log(self, message: str) -> None:
        if self.ctx.is_main:
            print(f"[train] {message}", file=sys.stderr, flush=True)

    def _start_tracking(self) -> None:
        if not self.ctx.is_main or self.cfg.logging.wandb_mode == "disabled":
            return
        import os

        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb.init(project=self.cfg.logging.wandb_project, name=self.run_id, id=self.run_id,
                                dir=str(self.paths.run_dir), mode=self.cfg.logging.wandb_mode, resume="allow",
                                config=to_dict(self.cfg))

    def _record(self, metrics: dict, started: float, first_step: int) -> None:
        if not self.ctx.is_main:
            return
        with open(self.paths.checkpoints / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics, sort_keys=True) + "\n")
        if self.wandb is not None:
            flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            flat.update({f"reward/{t}": v for t, v in metrics["reward_per_task"].items()})
            self.wandb.log(flat, step=metrics["step"])
        done = metrics["step"] - first_step
        rate = (time.monotonic() - started) / max(done, 1)
        eta = rate * (self.total - metrics["step"])
        self._log(f"step {metrics['step']}/{self.total} | reward {metrics['reward_mean']:.4f} "
                  f"± {metrics['reward_std']:.4f} | loss {metrics['policy_loss']:+.5f} | "
                  f"ratio {metrics['ppo_ratio_mean']:.6f} | {metrics['time_step_s']:.2f} s/step | "
                  f"ETA {math.ceil(eta)} s")

    def _trim_metrics(self, upto: int) -> None:
        """Keep only the metric lines of updates a resumed run will not redo."""
        path = self.paths.checkpoints / "metrics.jsonl"
        if not self.ctx.is_main or not path.exists():
            return
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= upto]
        atomic.write_text(path, "".join(line + "\n" for line in kept))

    def _checkpoint(self, step: int) -> None:
        checkpoint.save(self.paths.checkpoints, step, self.transformer, self.optimizer,
                        {"step": step, "scheduler": self.scheduler.state_dict(), "run_id": self.run_id},
                        self.ctx.rank, self.cfg.train.keep_checkpoints)

    def run(self) -> None:
        self.paths.checkpoints.mkdir(parents=True, exist_ok=True)
        start = self._resume()
        self._trim_metrics(start)
        self._start_tracking()
        self._log(f"{self.total} updates, world size {self.ctx.world_size}, starting at update {start}")
        started = time.monotonic()
        try:
            for step in range(start, self.total):
                metrics = self.train_step(step)
                self._record(metrics, started, start)
                if metrics["step"] % self.cfg.train.save_steps == 0 or metrics["step"] == self.total:
                    self._checkpoint(metrics["step"])
        finally:
            self.scorer.close()
            if self.wandb is not None:
                self.wandb.finish()
        self._export()

    def _export(self) -> None:
        """Write the declared outputs: the final transformer (Diffusers format) and the metrics."""
        if self.ctx.is_main:
            with atomic.atomic_directory(self.paths.final) as tmp:
                self.transformer.save_pretrained(str(tmp / "transformer"))
                (tmp / "training_state.json").write_text(json.dumps({"run_id": self.run_id, "updates": self.total},
                                                                    indent=2) + "\n")
            metrics = self.paths.checkpoints / "metrics.jsonl"
            atomic.write_text(self.paths.metrics, metrics.read_text() if metrics.exists() else "")
        distributed.barrier()
