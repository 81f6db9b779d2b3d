"""The project side of the comparison, and the tool's only contact with the project's internals.

Every import of `videogrpo` by the tool is in this module, and so is every assumption about the trainer:
when the trainer's interface changes, this is the one place to fix (tests/test_ref_diff.py runs it on stored
inputs, so such a change fails a test rather than the tool).

What the tool relies on:
- `Trainer(cfg, paths, ctx, run_id, order=..., scorer=...)` builds a real trainer from a `Config`, with the
  tool's prompts as the training order and a scorer that hands back the stored rewards;
- `trainer.model.encode_conditions(prompts, first_frames, height, width, num_frames)` and
  `trainer.model.decode(latents)`, replaced on the model instance: the prompt embeddings and first-frame
  conditions are the stored ones, and nothing is decoded (the rewards are given);
- `trainer.prepare(batch)` returns a `Prepared` whose `chunks` carry `members` and a `trajectory` with
  `latents` [N, T + 1, C, F, h, w] and `log_probs` [N, T]; `trainer.waves` lists each wave's (prompt, member)
  rows, in the order the scorer receives them;
- `trainer.update(action, prepared)` returns the update's metrics; `trainer.rolled_out` lists the batches
  rolled out since the last update;
- `trainer.experts.experts`: each `Expert`'s `name` (`transformer`, or `high`/`low`, whose Diffusers folders
  `models.i2v.EXPERT_FOLDERS` names), wrapped `module` and `optimizer`;
- the module-level `replay_log_prob` of `grpo/trainer.py`, wrapped for the duration of a run to record the
  policy's replayed log-probabilities;
- the counter-keyed draws of the rollout (`seeded_normal` keyed (seed, batch, prompt, member, step), x_T with
  member 0 and step 0x1A17 when the group shares it; `seeded_uniform` keyed (seed, batch, prompt, 0xE7A) for a
  per-prompt eta) and `trained_timesteps(T, fraction, seed, update)`: the `inputs` step draws with them what
  the reference is handed;
- `replay.plan`, `replay.total_updates` and `lr_schedule.learning_rate` for the schedule grid;
- `actor_schedule.schedule`, `updates_before` and `auto_prefetch` for the rollout actors' split schedule.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from common import (
    PROMPTS,
    adam_state,
    model_dir,
    params,
    perturb,
    perturb_seed,
    plan_shape,
    rank_suffix,
    shared_prompts,
)

# Project modules: every name of the project this tool reads is imported here.
from videogrpo.config import Config
from videogrpo.demo.tiny_i2v import save_tiny_i2v_pipeline
from videogrpo.demo.tiny_ti2v import save_tiny_pipeline
from videogrpo.grpo import objectives, replay
from videogrpo.grpo import trainer as trainer_module
from videogrpo.grpo.draws import seeded_normal, seeded_uniform
from videogrpo.grpo.lr_schedule import learning_rate
from videogrpo.grpo.sde_window import trained_timesteps
from videogrpo.models.i2v import EXPERT_FOLDERS, WanI2VA14B, first_frame_mask
from videogrpo.models.wan import WanTI2V
from videogrpo.parallel import process_groups

X_T_STEP = 0x1A17
ETA_STREAM = 0xE7A


def build_tiny_models(work: Path) -> None:
    """The project's tiny TI2V pipeline (`tiny`) and two-expert I2V pipeline (`tiny_i2v`), seed 0, where missing."""
    if not (work / "tiny/model_index.json").is_file():
        save_tiny_pipeline(work / "tiny", 0)
    if not (work / "tiny_i2v/model_index.json").is_file():
        save_tiny_i2v_pipeline(work / "tiny_i2v", 0)


def _load_model(kind: str, path: Path, max_text_tokens: int):
    if kind == "i2v_a14b":
        return WanI2VA14B(path, torch.device("cpu"), "float32", max_text_tokens=max_text_tokens)
    return WanTI2V(path, torch.device("cpu"), "float32", max_text_tokens=max_text_tokens)


def make_inputs(s: dict, model: Path) -> dict:
    """What both sides share, drawn and encoded by the project: per dataset item the prompt embeddings (the
    tiny UMT5) and the first-frame condition; per global batch x_T, every step's noise, the rewards and (per-prompt
    eta) the prompt's eta; per update the replayed timesteps."""
    per_epoch, epochs, max_steps = plan_shape(s)
    if per_epoch > len(PROMPTS):
        raise SystemExit(f"at most {len(PROMPTS)} batches per epoch")
    m = _load_model(s["kind"], model, s["L"])
    shape = m.geometry(s["frames"], s["height"], s["width"]).shape
    C, F, h, w = shape
    embeds = m.encode_prompts(PROMPTS[:per_epoch]).float()  # [B, L, D]
    # Conditions hold bf16 values, as model.condition_dtype bfloat16 makes them (and the reference's precompute).
    if s["kind"] == "i2v_a14b":  # [B, 4 + C, F, h, w]: the first-frame mask, then the condition latent
        mask = first_frame_mask(s["frames"], h, w, m.temporal)
        cond = torch.cat(
            [
                torch.cat([mask, torch.randn(1, C, F, h, w, generator=torch.Generator().manual_seed(7 + i))], dim=1)
                for i in range(per_epoch)
            ]
        )
    else:  # [B, C, 1, h, w]: the first latent frame
        cond = torch.cat(
            [torch.randn(1, C, 1, h, w, generator=torch.Generator().manual_seed(7 + i)) for i in range(per_epoch)]
        )
    cond = cond.to(torch.bfloat16).float()
    dev, seed, G, T = torch.device("cpu"), s["seed"], s["G"], s["T"]
    nb = per_epoch * epochs
    # The project's own draws of global batch b (one prompt per batch: prompt 0), x_T shared by the group.
    init = [seeded_normal(shape, dev, seed, b, 0, 0, X_T_STEP) for b in range(nb)]
    steps = [
        [torch.stack([seeded_normal(shape, dev, seed, b, 0, g, i) for g in range(G)]) for i in range(T)]
        for b in range(nb)
    ]
    etas = None
    if s["eta_range"]:
        lo, hi = s["eta_range"]
        etas = [seeded_uniform(lo, hi, seed, b, 0, ETA_STREAM) for b in range(nb)]
    rewards = [
        torch.tensor([0.1, 0.5, 0.2, 0.9][:G])
        if b == 0
        else torch.rand(G, generator=torch.Generator().manual_seed(100 + b))
        for b in range(nb)
    ]
    n_updates = replay.total_updates(replay.plan(per_epoch, epochs, s["save_steps"], max_steps, s["delayed"]))
    timesteps = {u: trained_timesteps(T, s["fraction"], seed, u) for u in range(1, n_updates + 1)}
    return dict(
        set=s,
        embeds=embeds,
        cond=cond,
        init=init,
        steps=steps,
        etas=etas,
        rewards=rewards,
        timesteps=timesteps,
        shape=shape,
    )


def make_config(s: dict, traj: str) -> Config:
    per_epoch, epochs, max_steps = plan_shape(s)
    cfg = Config()
    g, t, p = cfg.grpo, cfg.train, cfg.parallel
    cfg.model.kind = s["kind"]
    cfg.model.max_text_tokens = s["L"]
    g.sampler, g.eta, g.eta_range, g.sampling_steps, g.shift = (
        s["sampler"],
        s["eta"],
        s["eta_range"],
        s["T"],
        s["shift"],
    )
    g.guidance_scale, g.group_size, g.prompts_per_step, g.prompts_per_wave = 1.0, s["G"], 1, None
    g.timestep_fraction, g.share_group_noise, g.shuffle_advantages = s["fraction"], True, False
    g.clip_range, g.delayed_clip_range, g.delayed_replay = s["clip_range"], s["delayed_clip_range"], s["delayed"]
    g.kl_coeff, g.shared_prompts, g.trajectory_dtype = s["kl_coeff"], shared_prompts(s), traj
    g.sample_batch_size = None
    t.lr, t.weight_decay, t.max_grad_norm, t.warmup_steps = s["lr"], s["weight_decay"], s["max_grad_norm"], s["warmup"]
    t.seed, t.epochs, t.max_steps, t.save_steps = s["seed"], epochs, max_steps, s["save_steps"]
    t.auto_resume, t.resume_from, t.gradient_checkpointing, t.batch_size = False, None, False, 1
    t.offload_inference_models, t.experts = False, "both"
    p.param_dtype, p.reduce_dtype, p.attention_backend, p.compile = "float32", "float32", "native", False
    p.device, p.backend, p.tensor_parallel = "cpu", "gloo", s.get("tp", 1)
    p.data_parallel = "fsdp" if s["fsdp"] else "replicate"
    cfg.logging.tracker, cfg.logging.wandb_mode = ["none"], "disabled"
    cfg.video.num_frames, cfg.video.height, cfg.video.width = s["frames"], s["height"], s["width"]
    return cfg


class FixedRewards:
    """The scorer: hands back the stored rewards of the batch being prepared, in the order rows are submitted."""

    def __init__(self):
        self.queue: list[float] = []

    def submit(self, request):
        from concurrent.futures import Future

        future = Future()
        future.set_result({"score": float(self.queue.pop(0))})
        return future

    def collect(self, futures):
        return [f.result() for f in futures]

    def close(self, kill: bool = False):
        pass


def run_trainer(d: dict, model: Path, run_dir: Path, traj: str = "float32") -> dict:
    """The project's real `Trainer.run()` (plan, rollouts, advantages, PPO and KL, gradient reduction, clipping,
    lr schedule, AdamW, checkpoint and export) on the stored inputs; returns this rank's side record."""
    s = d["set"]
    per_epoch, _, _ = plan_shape(s)
    ctx = process_groups.init("cpu", "gloo", torch.get_num_threads())
    if ctx.world_size != s["world"]:
        raise SystemExit(f"inputs are for world {s['world']}, running {ctx.world_size}")
    cfg = make_config(s, traj)
    run_dir = Path(run_dir) / f"r{ctx.rank}"
    paths = trainer_module.TrainPaths(
        model, run_dir, None, run_dir / "checkpoints", run_dir / "final", run_dir / "metrics.jsonl", run_dir
    )
    order = [
        SimpleNamespace(task="t", sample_id=str(i), directory=run_dir, prompt=PROMPTS[i], first_frame=run_dir / "x.png")
        for i in range(per_epoch)
    ]
    scorer = FixedRewards()
    tr = trainer_module.Trainer(cfg, paths, ctx, "ref_diff", order=order, scorer=scorer)
    index = {prompt: i for i, prompt in enumerate(PROMPTS)}

    def conditions(prompts, first_frames, height, width, num_frames=None):
        ids = [index[x] for x in prompts]
        return d["embeds"][ids].to(tr.model.compute_dtype), d["cond"][ids]

    tr.model.encode_conditions = conditions
    tr.model.decode = lambda latents: [None] * latents.shape[0]
    # Keyed by Diffusers folder (`transformer`, `transformer_2`): the reference's attribute names.
    experts = {EXPERT_FOLDERS.get(e.name, e.name): e for e in tr.experts.experts}
    modules = {prefix: e.module for prefix, e in experts.items()}
    for prefix, module in modules.items():
        perturb(module, s["perturb"], perturb_seed(prefix))
    before = params(modules)

    rollouts, updates, new_lp = {}, [], []
    prepare, update = tr.prepare, tr.update

    def prepare_recorded(batch_index):
        scorer.queue = [d["rewards"][batch_index][g].item() for wave in tr.waves for _, g in wave]
        t0 = time.time()
        prepared = prepare(batch_index)
        latents = torch.cat([c.trajectory.latents for c in prepared.chunks]).float()
        members = [g for c in prepared.chunks for g in c.members]
        rollouts[batch_index] = dict(
            latents=latents,
            log_probs=torch.cat([c.trajectory.log_probs for c in prepared.chunks]).float(),
            members=members,
            seconds=time.time() - t0,
        )
        if "init" in d:  # the x_T the reference is handed (stored comparisons keep no noise)
            x_t = d["init"][batch_index].to(torch.float32 if traj == "float32" else torch.bfloat16).float()
            frames = slice(1, None) if tr.model.pins_first_frame else slice(None)  # TI2V: frame 0 is the condition
            rollouts[batch_index]["x_t_vs_inputs"] = (latents[:, 0, :, frames] - x_t[:, frames]).abs().max().item()
        return prepared

    def update_recorded(action, prepared):
        rolled = list(tr.rolled_out)
        new_lp.clear()
        t0 = time.time()
        m = update(action, prepared)
        m1, m2 = adam_state(modules, {prefix: e.optimizer for prefix, e in experts.items()})
        updates.append(
            dict(
                update=action.update,
                replayed=prepared.batch,
                rolled_out=rolled,
                seconds=time.time() - t0,
                metrics={k: v for k, v in m.items() if isinstance(v, (int, float))},
                new_log_probs=torch.stack(new_lp),
                params=params(modules),
                exp_avg=m1,
                exp_avg_sq=m2,
            )
        )
        return m

    tr.prepare, tr.update = prepare_recorded, update_recorded
    policy_modules = [e.module for e in experts.values()]
    replay_log_prob = objectives.replay_log_prob  # patched where the update's objective reads it

    def replay_recorded(model_, transformer, *a, **k):
        r = replay_log_prob(model_, transformer, *a, **k)
        first = next(iter(transformer.values())) if isinstance(transformer, dict) else transformer
        if any(first is m for m in policy_modules):  # the policy's, not the frozen reference's
            new_lp.append(r.log_prob.detach().float().clone())
        return r

    objectives.replay_log_prob = replay_recorded
    t0 = time.time()
    try:
        tr.run()
    finally:
        objectives.replay_log_prob = replay_log_prob
    record = dict(
        side="videogrpo" + ("-traj-bf16" if traj == "bfloat16" else ""),
        set=s,
        rank=ctx.rank,
        before=before,
        rollouts=rollouts,
        updates=updates,
        plan=[a.__dict__ for a in tr.actions],
        total=tr.total,
        t_total=time.time() - t0,
    )
    process_groups.shutdown()
    return record


def run_side(inp: str, out: str, traj: str, model: str | None = None) -> None:
    """`videogrpo` step: run the trainer on an inputs file and write this rank's side file."""
    d = torch.load(inp)
    path = Path(model) if model else model_dir(d["set"])
    rank = int(os.environ.get("RANK", "0"))
    run_dir = Path(os.environ.get("DIFF_WORK", ".")) / "run_videogrpo" / Path(out).stem
    record = run_trainer(d, path, run_dir, traj)
    torch.save(record, rank_suffix(out, rank))
    if rank == 0:
        for u in record["updates"]:
            keys = ("policy_loss", "kl_loss", "grad_norm", "learning_rate", "replayed_batch")
            print(
                f"{record['side']} update {u['update']}:",
                json.dumps({k: u["metrics"].get(k) for k in keys}),
                "rolled out",
                u["rolled_out"],
            )
        print(f"{record['side']}: {len(record['updates'])} updates in {record['t_total']:.2f}s")


def schedules(grid: list[dict], lr: float, clip: float, delayed_clip: float) -> list[dict]:
    """The project's schedule for every grid point: `replay.plan`, `total_updates` and `learning_rate`."""
    runs = []
    for pt in grid:
        actions = replay.plan(pt["batches"], pt["epochs"], pt["save_steps"], pt["max_steps"], pt["delayed"])
        total, rolled, ups = replay.total_updates(actions), [], []
        for a in actions:
            rolled += [a.batch] if a.prepare else []
            if a.update is not None:
                ups.append(
                    dict(
                        update=a.update,
                        replayed=a.replay,
                        rolled_out=rolled,
                        staleness=a.staleness,
                        flush=a.flush,
                        clip=delayed_clip if pt["delayed"] else clip,
                        lr=learning_rate(a.update - 1, pt["warmup"], total, lr),
                    )
                )
                rolled = []
        runs.append(dict(point=pt, total=total, updates=ups))
    return runs


def split_schedules(grid: list[dict]) -> list[dict]:
    """The project's rollout-actor schedule for every split_schedule grid point: per batch dealt, the updates taken
    when it is dealt and its policy version (`actor_schedule` on `replay.plan`)."""
    from videogrpo.grpo import actor_schedule, replay

    runs = []
    for pt in grid:
        actions = replay.plan(pt["batches"], pt["epochs"], 0, pt["max_steps"], False)
        prefetch = pt["prefetch"] or actor_schedule.auto_prefetch(pt["actors"], pt["group"], pt["sample"])
        done = actor_schedule.updates_before(actions)
        steps = [
            {"step": d.action, "created_after": done[d.at], "version": d.version}
            for d in actor_schedule.schedule(actions, prefetch, pt["interval"])
        ]
        runs.append({"point": pt, "prefetch": prefetch, "steps": steps})
    return runs
