"""The GRPO training loop that runs on every torchrun rank.

The run is a list of actions from `replay.plan`: each consumes one global batch, which it prepares
unless a delayed-replay flush skips it (every rank reads the batch whole and rolls out its share of
each prompt's group, wave by wave, then submits the decoded videos to the reward pool), and, unless
it is a prefill, replays one prepared batch in one optimizer update: rewards collected and gathered
over the ranks of each group, group-relative advantages, a PPO-clipped loss over a seeded subset of
the recorded timesteps, gradients reduced by FSDP or one all-reduce, the learning rate of
`lr_schedule`. Rewards of a batch are scored while the next one rolls out. Checkpoints follow
flushing updates, so they never hold prepared work. Master weights and AdamW state are float32;
`parallel.param_dtype` is only the compute dtype. Logged metrics are reduced over all ranks: sums
all-reduced, maxima (the PPO ratio's, peak memory) max-reduced. The sigma schedule's flow shift is the
model's unless `grpo.shift` overrides it (`models.wan.flow_shift`). Where the frozen models and the
trajectories live between phases, and how a wave is cut into rollout chunks, is `offload`'s schedule.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from videogrpo import atomic
from videogrpo.config import Config, setting_warnings, to_dict
from videogrpo.data.dataset import SampleRef, load_split, steps_per_epoch, training_order
from videogrpo.grpo import (
    actors,
    assignment,
    checkpoint,
    export,
    flops,
    gold_rewards,
    minibatches,
    nft,
    objectives,
    offload,
    refiners,
    replay,
    rollout_batch,
    sde_window,
    sft_init,
    validation,
    weight_copy,
)
from videogrpo.grpo.experts import Experts
from videogrpo.grpo.lr_schedule import learning_rate
from videogrpo.grpo.peak_memory import PeakMemory
from videogrpo.grpo.rollout_batch import Prepared
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.grpo.tracking import Tracker
from videogrpo.grpo.tracking import log as log_line
from videogrpo.grpo.weight_copy import WeightCopy
from videogrpo.models.i2v import WanI2VA14B
from videogrpo.models.wan import WanTI2V, flow_shift, tile_decoding
from videogrpo.parallel import process_groups
from videogrpo.rewards import NoScorer
from videogrpo.rewards.terms import training_scorer

PPO_SUMS = ("ppo_clip_fraction", "ppo_ratio_mean", "ppo_approx_kl")
NFT_SUMS = ("nft_positive_loss", "nft_negative_loss", "nft_optimality_mean")
"""The per-row diagnostics an update logs besides its loss and KL, by algorithm (grpo.algorithm)."""


@dataclass
class TrainPaths:
    model: Path
    dataset: Path
    evalkit: Path | None
    checkpoints: Path
    final: Path
    metrics: Path
    run_dir: Path
    input_digests: dict[str, str] = field(default_factory=dict)
    """Digests of the training inputs (model, dataset, training ids): checkpoints record them."""
    refiners: dict[str, Path] = field(default_factory=dict)
    """Each prompt refiner's download by its name (refiners.experts)."""

    @property
    def best(self) -> Path:
        """train.keep_best_by's export, beside final/."""
        return self.final.with_name("best")

    @property
    def ema(self) -> Path:
        """train.ema_decay's export, beside final/."""
        return self.final.with_name("ema")

    @classmethod
    def under(cls, run_dir: Path, model: Path, dataset: Path, evalkit: Path | None) -> TrainPaths:
        """Every output in one run directory (checkpoints/, final/, metrics.jsonl), as in-process runs lay it out."""
        return cls(
            model, dataset, evalkit, run_dir / "checkpoints", run_dir / "final", run_dir / "metrics.jsonl", run_dir
        )


def run_plan(cfg: Config, num_samples: int) -> list[replay.Action]:
    t, batches = cfg.train, steps_per_epoch(num_samples, cfg.grpo.prompts_per_step)
    return replay.plan(batches, t.epochs, t.save_steps, t.max_steps, cfg.grpo.delayed_replay)


class Trainer:
    def __init__(
        self,
        cfg: Config,
        paths: TrainPaths,
        ctx: process_groups.Context,
        run_id: str,
        *,
        order: list[SampleRef] | None = None,
        scorer=None,
    ):
        """`order` and `scorer`, when given, stand in for the training order read from `paths.dataset` and for
        the scorer the reward config makes (tools/ref_diff hands in its prompts and fixed rewards)."""
        self.cfg, self.paths, self.ctx, self.run_id = cfg, paths, ctx, run_id
        # Seeded per data replica: TP peers must draw alike (every draw of the run is counter-keyed; this one's
        # stream is for anything that is not).
        torch.manual_seed(assignment.replica_seed(cfg.train.seed, ctx.rank, cfg.parallel.tensor_parallel))
        offloading = cfg.train.offload_inference_models
        frozen_device = offload.HOST if offloading else None
        if cfg.model.kind == "i2v_a14b":
            if ctx.device.type == "cuda":  # as the reference's A14B trainer: SDPA without its cuDNN kernel
                torch.backends.cuda.enable_cudnn_sdp(False)
            self.model = WanI2VA14B.from_config(paths.model, ctx.device, cfg, frozen_device, cfg.train.experts)
        else:
            self.model = WanTI2V.from_config(paths.model, ctx.device, cfg, frozen_device)
        tile_decoding(self.model.vae, cfg.grpo.vae_tile_size)  # the rollouts' (and validation's) decode only
        routed = not self.model.pins_first_frame
        self.experts = Experts.build(self.model.trainable, routed, cfg, ctx.world_size, ctx.device)
        self.layout = self.experts.layout()
        modules = list(self.experts.modules().values())
        self.nft_old = WeightCopy(self.experts.params, modules) if cfg.grpo.algorithm == "nft" else None
        """DiffusionNFT's old policy: it samples the rollouts and anchors the loss (None for GRPO)."""
        self.ema = WeightCopy(self.experts.params, modules) if cfg.train.ema_decay is not None else None
        """The moving average of the trained weights (train.ema_decay), exported as ema/ (None: off)."""
        self.refiners = refiners.Refiners(cfg, paths.refiners, ctx.device) if cfg.has_refiners else None
        """The prompt refiners trained beside the generator (the `refiners` section; None: off)."""
        self.scores = self.experts.tp_rank(ctx.rank) == 0
        """Whether this rank decodes and scores its rollouts: under TP only tp_rank 0 of each pair does."""
        self.placement = offload.Placement(
            ctx.device,
            offloading,
            {"text_encoder": self.model.text_encoder, "vae": self.model.vae},
            {"text_encoder": [self.model.text_encoder], "vae": [self.model.vae.encoder, self.model.vae.decoder]},
            decodes=self.scores,
        )
        self.order = (
            order if order is not None else training_order(load_split(paths.dataset, "rl"), cfg.data.shuffle_seed)
        )
        self.actions = run_plan(cfg, len(self.order))
        self.total = replay.total_updates(self.actions)
        self.shift, self.shift_source = flow_shift(cfg, paths.model)
        self.sigmas = sigma_schedule(cfg.grpo.sampling_steps, self.shift)
        self.shape = self.model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width).shape
        self.waves = assignment.waves(cfg, ctx.rank, ctx.world_size)
        self.policy_version = 0
        """Updates the weights have taken (their version)."""
        self.feed: actors.Feed | None = None
        """With rollout actors: what they are dealt, when, under which weights (made once the start is known)."""
        self.resumed: Path | None = None
        """The checkpoint this run continues (full state), if any."""
        if scorer is not None:
            self.scorer = scorer
        elif ctx.link is not None:  # rollout actors score the rollouts; their results come with them
            self.scorer = actors.ReceivedScores()
        elif not self.scores:
            self.scorer = NoScorer()
        else:
            self.scorer = training_scorer(cfg, paths.evalkit, sorted({s.task for s in self.order}))
        self.gold_scorers = {}  # train.validate_rewards: scorers of the validation points only
        if self.scores and cfg.train.validate_rewards:
            tasks = sorted({s.task for s in validation.prompts(cfg, paths.dataset)})
            self.gold_scorers = gold_rewards.start_scorers(cfg, paths.evalkit, tasks)
        self.watch = gold_rewards.Watch.for_config(cfg)
        self.stopped_at: int | None = None
        """The update training stopped at, before its last (train.stop_on_divergence)."""
        self.tracker: Tracker | None = None
        self.guard = checkpoint.resume_guard(run_id, paths.input_digests)
        self.topology = assignment.dataloader_topology(cfg, ctx.world_size, self.order)
        self.memory = PeakMemory(ctx.device)
        self.rolled_out: list[int] = []
        """Batches rolled out since the last update (logged with it: skipped batches never appear)."""

    # ---- preparing a batch: rollouts and reward submission -----------------------------------------

    def prepare(self, batch_index: int) -> Prepared:
        """This rank's rollouts of batch `batch_index`, scoring submitted (rollout_batch.prepare); with rollout
        actors, received from them, scored (actors.Feed)."""
        if self.feed is None:
            return rollout_batch.prepare(self, batch_index)
        return rollout_batch.prepare(self, batch_index, self.feed.receive, self.feed.version(batch_index))

    # ---- replaying prepared batches: one optimizer update ------------------------------------------

    def _advantages(self, prepared: Prepared) -> dict:
        """Rewards collected and gathered, each chunk's advantages set; reward stats (rollout_batch.advantages)."""
        return rollout_batch.advantages(self, prepared)

    def update(self, action: replay.Action, prepared: Prepared) -> dict:
        """Replay `prepared` in its optimizer updates (one, as the reference, or grpo.updates_per_batch in each of
        grpo.update_passes passes: minibatches); returns the step's metrics, reduced over all ranks."""
        cfg, g = self.cfg, self.cfg.grpo
        t0 = time.monotonic()
        gathered = self._advantages(prepared)
        self.placement.enter("replay")
        self.memory.enter("replay")
        t1 = time.monotonic()
        timesteps = sde_window.replayed_steps(g, cfg.train.seed, prepared.batch, action.update)
        clip = g.delayed_clip_range if g.delayed_replay else g.clip_range
        if not timesteps:  # a sliding window at the end of its sweep (MixGRPO's schedule): this update trains nothing
            self._log(f"update {action.update}: batch {prepared.batch}'s SDE window holds no step; nothing trained")
        skipped = gathered["skipped"]
        nft_run = g.algorithm == "nft"
        sums = dict.fromkeys(("policy_loss", "kl_loss", *(NFT_SUMS if nft_run else PPO_SUMS)), 0.0)
        ratio_abs_max, grad_norms, rates = 0.0, [], []
        per_step = minibatches.updates_per_step(g)
        # grpo.drop_zero_advantage: only the rollouts with an advantage (and those put back) are replayed.
        kept = (
            minibatches.kept_rows(g, cfg.train.seed, prepared.batch, gathered["advantages"])
            if g.drop_zero_advantage
            else None
        )
        for k, (pass_index, rows) in enumerate(minibatches.update_sets(g, cfg.train.seed, prepared.batch, kept)):
            largest = objectives.replay_update(self, prepared, rows, pass_index, timesteps, clip, skipped, sums)
            ratio_abs_max = max(ratio_abs_max, largest)
            t = cfg.train  # the schedule runs over every optimizer update of the run
            lr = learning_rate(
                (action.update - 1) * per_step + k, t.warmup_steps, self.total * per_step, t.lr, t.lr_schedule
            )
            optimizer_update = (action.update - 1) * per_step + k + 1  # counted over the run
            if self.ema is not None:  # the moving average's repeats that come before this update's step
                weight_copy.step_ema(self.ema, optimizer_update, cfg.train, after=False)
            grad_norms.append(self.experts.step(lr, cfg.train.max_grad_norm) if timesteps else 0.0)
            rates.append(lr)
            if self.ema is not None:
                weight_copy.step_ema(self.ema, optimizer_update, cfg.train, after=True)
        trained_refiners = {}
        if self.refiners is not None:  # one update of each refiner a batch, on train.lr_schedule's shape
            t = cfg.train
            shape = learning_rate(
                (action.update - 1) * per_step, t.warmup_steps, self.total * per_step, 1.0, t.lr_schedule
            )
            trained_refiners = self.refiners.step(prepared.chunks, gathered["refiner_advantages"], shape)
            trained_refiners.update(self._record_rewrites(prepared))
        if self.nft_old is not None:  # after the batch's updates, as DiffusionNFT's authors: old <- d old + (1 - d) new
            self.nft_old.mix(
                nft.old_decay(
                    action.update * per_step, g.nft_old_decay_rate, g.nft_old_decay_max, g.nft_old_decay_after
                )
            )
        # The metrics' means are over every term replayed: |T| x G x P a pass (the kept rows when dropping).
        replayed = len(kept) if kept is not None else g.group_size * g.prompts_per_step
        normalizer = len(timesteps) * replayed * g.update_passes
        t2 = time.monotonic()
        # Sums count each data replica once: a TP peer's terms are its tp_rank 0's.
        reduced = process_groups.reduce_floats([v if self.scores else 0.0 for v in sums.values()], self.ctx.device)
        means = {key: total / max(normalizer, 1) for key, total in zip(sums, reduced)}
        [ratio_abs_max] = process_groups.reduce_floats([ratio_abs_max], self.ctx.device, op="max")
        phases = self.memory.phase_peaks()
        peaks = [float(self.memory.peak()), *(float(phases.get(p, 0)) for p in ("rollout", "replay"))]
        peaks = process_groups.reduce_floats(peaks, self.ctx.device, "max")
        rewards = gathered["rewards"]
        return dict(
            means,
            step=action.update,
            epoch=prepared.epoch,
            replayed_batch=prepared.batch,
            reward_mean=rewards.mean().item(),
            reward_std=rewards.std().item(),
            reward_std_within_group=rewards.std(dim=1).mean().item(),
            advantage_mean=gathered["advantages"].mean().item(),
            reward_per_task={t: float(np.mean(v)) for t, v in sorted(gathered["per_task"].items())},
            reward_errors=gathered["errors"],
            **gathered["terms"],
            **({} if nft_run else {"ppo_ratio_abs_max": ratio_abs_max, "ppo_clip_range": clip}),
            **({} if skipped is None else {"zero_variance_groups": int(skipped.sum())}),
            **({} if kept is None else {"dropped_rollouts": g.group_size * g.prompts_per_step - len(kept)}),
            grad_norm=float(np.mean(grad_norms)),
            learning_rate=rates[0],
            **({"optimizer_updates": per_step, "grad_norm_per_update": grad_norms} if per_step > 1 else {}),
            delayed_replay_staleness=action.staleness,
            trained_timesteps=len(timesteps),
            peak_memory_bytes=int(peaks[0]),
            peak_memory_rollout_bytes=int(peaks[1]),
            peak_memory_replay_bytes=int(peaks[2]),
            time_reward_wait_s=t1 - t0,
            time_replay_s=t2 - t1,
            **trained_refiners,
        )

    def _record_rewrites(self, prepared: Prepared) -> dict:
        """The batch's rewrites written as one JSONL beside the checkpoints (exported with the weights), and each
        refiner's fallbacks counted over the ranks: the metrics that say so."""
        rows = [
            row
            for part in process_groups.all_gather_objects(refiners.rewrite_rows_record(prepared.chunks))
            for row in part
        ]
        counts = refiners.fallback_counts(prepared.chunks)
        found = {}
        for e in self.refiners.experts:
            made, cut, unparsed = process_groups.reduce_floats(counts.get(e.name, [0, 0, 0]), self.ctx.device)
            found.update({f"refiner/{e.name}/rewrites": int(made), f"refiner/{e.name}/fallback_cut": int(cut)})
            found[f"refiner/{e.name}/fallback_unparsed"] = int(unparsed)
            if cut or unparsed:
                self._log(
                    f"batch {prepared.batch}: refiner {e.name}: {int(cut)} of {int(made)} rewrites cut at "
                    f"max_new_tokens and {int(unparsed)} without a rewrite fell back to the prompt they rewrote"
                )
        if self.ctx.is_main:
            path = refiners.rewrites_file(self.paths.checkpoints, prepared.batch)
            found["refiner_rewrites_sha256"] = refiners.write_rewrites(path, prepared.batch, rows)
        return found

    # ---- the run -----------------------------------------------------------------------------------

    def _resume(self) -> int:
        """Index of the first action to run: after the newest complete checkpoint, or a fresh start."""
        cfg = self.cfg
        for why in checkpoint.ignored_folders(self.paths.checkpoints):
            self._log(why)
        latest = checkpoint.latest_complete(self.paths.checkpoints) if cfg.train.auto_resume else None
        if not cfg.train.auto_resume and (kept := checkpoint.complete_checkpoints(self.paths.checkpoints)):
            self._log(
                f"train.auto_resume is false: the {len(kept)} complete checkpoint(s) in {self.paths.checkpoints} "
                f"(newest {kept[-1].name}) are not resumed"
            )
        if latest is not None:
            checkpoint.check_resumable(latest, self.guard, cfg.train.resume_across_code_changes)
            replay.check_position(self.actions, latest, checkpoint.read_state(latest))
            state = checkpoint.load(latest, self._parts(), None, self.ctx.rank, extra=self._extra_state())
            self._settle_old_policy(state.get("extra", []))
            if self.refiners is not None:
                self.refiners.set_versions(state["update"])
            if self.watch:  # the alarm's points up to the checkpoint, whether it fired, the best point's weights
                self.watch.restore(state.get("divergence_watch"), state["update"])
                export.check_snapshot(self.paths.checkpoints, self.watch.best)
            self._log(f"resumed from {latest} (update {state['update']} of {self.total})")
            self.resumed = latest
            return state["next_action"]
        if cfg.train.resume_from:
            # Only a fresh start reads it: a run with a checkpoint of its own continues that, full state, whatever
            # reset_dataloader says (the reference restarts weights-only at every auto-resume: docs/fidelity.md).
            source = Path(cfg.train.resume_from)
            if cfg.train.reset_dataloader:  # weights only: this project's or the reference's layouts (sft_init)
                report = sft_init.load_initial_weights(source, self.experts.modules(), log=self._log)
                self._settle_old_policy([])
                self._log(f"initialised from {source} (weights only): {report.summary()}")
                return 0
            # A full-state start continues the source's data position and per-rank state: same topology, same plan.
            replay.check_position(self.actions, source, checkpoint.check_topology(source, self.topology))
            state = checkpoint.load(source, self._parts(), None, self.ctx.rank, extra=self._extra_state())
            self._settle_old_policy(state.get("extra", []))
            if self.refiners is not None:
                self.refiners.set_versions(state["update"])
            self._log(f"initialised from {source} (full state)")
            self.resumed = source
            return state["next_action"]
        return 0

    def _parts(self) -> dict:
        """What a checkpoint holds by part: the generator's experts and their AdamWs, and each refiner's."""
        return self.experts.parts() | (self.refiners.parts() if self.refiners is not None else {})

    def _copies(self) -> dict[str, WeightCopy]:
        """The weight copies beside the trained weights, by their name in a checkpoint."""
        return {name: copy for name, copy in (("nft_old", self.nft_old), ("ema", self.ema)) if copy is not None}

    def _extra_state(self) -> dict:
        """What a checkpoint holds besides the experts and their optimizers: DiffusionNFT's old policy, the moving
        average."""
        return {name: copy.state(self.experts.param_names()) for name, copy in self._copies().items()}

    def _settle_old_policy(self, loaded: list[str]) -> None:
        """After weights were loaded: each weight copy is the checkpoint's, or else the loaded weights."""
        for name, copy in self._copies().items():
            if name not in loaded:
                copy.reset()
                what = "grpo.algorithm nft: the old policy" if name == "nft_old" else "train.ema_decay: the average"
                self._log(f"{what} starts as the loaded weights (the source holds none)")

    def _log(self, message: str) -> None:
        if self.ctx.is_main:
            log_line(message)

    def _checkpoint(self, action_index: int, update: int) -> None:
        checkpoint.save(
            self.paths.checkpoints,
            update,
            self._parts(),
            None,
            {
                "update": update,
                "next_action": action_index + 1,
                "run_id": self.run_id,
                "guard": self.guard,
                "topology": self.topology,
                **({"divergence_watch": self.watch.state()} if self.watch else {}),
            },
            self.ctx.rank,
            self.cfg.train.keep_checkpoints,
            extra=self._extra_state(),
            host_files={"rollout_weights": self.feed.kept(action_index + 1)} if self.feed is not None else None,
        )
        if self.watch and self.watch.best_by and self.ctx.is_main:  # the best snapshots no checkpoint names go
            export.prune_snapshots(self.paths.checkpoints, self.watch.best["update"] if self.watch.best else None)

    def run(self) -> None:
        """Train, then export. The scorer pool is closed on every way out: a refused resume included; on an
        error or Ctrl-C its scorer processes are abandoned, not waited for."""
        scorers = [self.scorer, *self.gold_scorers.values()]
        try:
            self._train()
            if self.feed is not None:
                self.feed.stop()
        except BaseException:
            for scorer in scorers:
                scorer.close(kill=True)
            raise
        finally:
            for scorer in scorers:
                scorer.close()
        self._export()

    def _train(self) -> None:
        self.paths.checkpoints.mkdir(parents=True, exist_ok=True)
        start = self._resume()
        done = self.actions[start - 1].update if start else 0
        self.tracker = Tracker(
            self.paths.checkpoints / "metrics.jsonl",
            self.total,
            self.cfg.logging,
            self.run_id,
            self.paths.run_dir,
            to_dict(self.cfg),
            enabled=self.ctx.is_main,
        )
        self.tracker.trim(done if start else -1)  # a fresh start redoes validation point 0 too
        t, batches = self.cfg.train, steps_per_epoch(len(self.order), self.cfg.grpo.prompts_per_step)
        length = replay.describe(self.actions, batches, t.epochs, t.max_steps, self.cfg.grpo.delayed_replay)
        share = assignment.describe_share(self.waves, self.ctx.rank)
        if self.ctx.link is not None:  # rollout actors roll out this rank's share; it replays it
            share = share.replace(" rolls out ", " replays ", 1)
        layout = f"world size {self.ctx.world_size}, {self.cfg.parallel.data_parallel}"
        where = f"{layout}, {share}, starting at batch {start}"
        self._log(f"{length}; {where}")
        self._log(f"parameters: {json.dumps(self.layout)}")
        self._log(f"flow shift {self.shift} ({self.shift_source})")
        if window := sde_window.describe(self.cfg.grpo):
            self._log(window)
        if split := actors.describe(self.cfg):
            self._log(split)
        self.policy_version = done
        if self.ctx.link is not None:
            self.feed = actors.Feed(self, start, actors.kept_weights(self.resumed, self.ctx.is_main))
        # The run's length is known here, with or without train.max_steps.
        for warning in setting_warnings(self.cfg, self.total * minibatches.updates_per_step(self.cfg.grpo)):
            self._log(f"warning: {warning}")
        slot: Prepared | None = None
        try:
            if validation.before_training(self.cfg, start):
                self._validate(0)
            if start and self._stopped(done):  # a rerun of a run the alarm stopped exports the same weights
                start = len(self.actions)
            for index in range(start, len(self.actions)):
                action = self.actions[index]
                t0 = time.monotonic()
                if not self.rolled_out:  # a logged period starts: its peak covers its rollouts and replay
                    self.memory.reset()
                if self.feed is not None:  # the batches due to the actors by now (the first action's, on a start)
                    self.feed.advance(index)
                fresh = self.prepare(action.batch) if action.prepare else None
                if action.update is None:
                    slot = fresh
                    continue
                target = fresh if action.replay == action.batch else slot
                if target is None or target.batch != action.replay:
                    raise RuntimeError(
                        f"action {index}: batch {action.replay} is not prepared (the plan and the trainer disagree)"
                    )
                metrics = self.update(action, target)
                self.policy_version = action.update
                if self.feed is not None:  # dealt before validation and checkpoints, so the actors overlap them
                    self.feed.advance(index + 1)
                    metrics.update(self.feed.staleness(action, target))
                slot = None if action.flush else fresh
                metrics.update(
                    rolled_out_batches=self.rolled_out,
                    time_step_s=time.monotonic() - t0,
                    time_rollout_s=fresh.time_rollout_s if fresh else 0.0,
                )
                metrics.update(flops.update_metrics(self, metrics, fresh.batch if fresh else None))
                self.rolled_out = []
                self.tracker.record(metrics)
                if validation.due(self.cfg, action.update, self.total):  # before the checkpoint: resumes neither
                    self._validate(action.update)  # redo nor skip it
                if replay.should_checkpoint(action, self.cfg.train.save_steps, self.total):
                    self._checkpoint(index, action.update)
                    if self._stopped(action.update):
                        break
        finally:
            self.tracker.close(stopped=self.stopped_at is not None)

    def _stopped(self, update: int) -> bool:
        """train.stop_on_divergence: the alarm has fired, so training ends at this checkpoint, after update `update`."""
        if not (self.watch and self.watch.stops()):
            return False
        self.stopped_at = update
        self._log(
            f"stopping after update {update} of {self.total}: the divergence alarm fired at update "
            f"{self.watch.fired_at} and train.stop_on_divergence is set; the export holds these weights "
            f"(train.resume_past_divergence: true trains on)"
        )
        return True

    def _validate(self, update: int) -> None:
        record = validation.validate(self, update)
        for line in self.watch.observe(record) if self.watch else []:  # the divergence alarm (gold rewards)
            self._log(line)
        if self.watch and self.watch.improved:  # train.keep_best_by: the best point's weights so far
            export.write_weights(
                self, export.snapshot(self.paths.checkpoints, update), dict(sorted(self.watch.best.items()))
            )
        self.tracker.record_validation(record)

    def _export(self) -> None:
        """Write the declared outputs: the final transformer(s) (grpo/export.py), the metrics and, with
        train.keep_best_by, best/; with train.ema_decay, ema/."""
        state = {"run_id": self.run_id, "updates": self.stopped_at or self.total, "layout": self.layout}
        if self.stopped_at is not None:
            state["stopped_by_divergence_alarm"] = {"fired_at": self.watch.fired_at, "of_updates": self.total}
        export.write_weights(self, self.paths.final, state)
        if self.ema is not None:  # train.ema_decay: ema/ beside final/, the average swapped in
            with self.ema.swapped_in():
                optimizer_updates = state["updates"] * minibatches.updates_per_step(self.cfg.grpo)
                ema = weight_copy.ema_record(self.cfg.train, optimizer_updates)
                export.write_weights(self, self.paths.ema, dict(state, ema=ema))
        if self.ctx.is_main:
            metrics = self.paths.checkpoints / "metrics.jsonl"
            atomic.write_text(self.paths.metrics, metrics.read_text() if metrics.exists() else "")
            if self.cfg.train.keep_best_by:
                points = len(self.watch.history)
                export.export_best(self.paths.checkpoints, self.paths.best, self.watch.best, self.watch.best_by, points)
        process_groups.barrier()
