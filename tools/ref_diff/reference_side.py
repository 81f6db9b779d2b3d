"""The reference side: the reference's own DanceGRPOTrainer (its __init__, `_grpo_step` and `train()` loop,
unedited, patched at runtime by reference_patches.py) on an inputs file, and its schedule for the plan grid.

Runs in the reference's environment (run_all.sh builds it), with the reference checkout at $VBVR_RL_ROOT
(default $DIFF_WORK/vbvr-rl). Imports nothing of the project.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from common import (
    EXPERT_NAMES,
    WORK,
    adam_state,
    model_dir,
    params,
    perturb,
    perturb_seed,
    plan_shape,
    rank_suffix,
    shared_prompts,
)
from reference_patches import NoiseQueue, apply_cpu_patches

apply_cpu_patches()

from src.trainer.config import RLConfig  # noqa: E402
from src.trainer.dancegrpo_trainer import DanceGRPOTrainer  # noqa: E402
from src.trainer.rewards.base import BaseReward  # noqa: E402
from src.trainer.rewards.registry import register_reward  # noqa: E402
from torch.utils.data import Dataset, DistributedSampler  # noqa: E402

DATA: dict = {"items": [], "size": 4}
REWARD: dict = {"fn": None}
HOOKS: dict = {"pre_fsdp": None}


class InMemoryLatents(Dataset):
    """Precomputed-latent items as the reference's latent dataset yields them (prompt_embeds, video_latents,
    condition); filled by the comparison, placeholders for the schedule grid."""

    def __init__(self, n: int):
        self.items = DATA["items"][:n] or [dict(prompt_embeds=torch.zeros(1)) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@register_reward("ref_diff_injected")
class InjectedReward(BaseReward):
    """The stored rewards of the batch being rolled out (REWARD['fn'] of the generated latents)."""

    @torch.no_grad()
    def __call__(self, generated_latents, gt_video_latents, condition, prompt_embeds, *, meta=None):
        return REWARD["fn"](generated_latents).float()


class CPUDanceGRPOTrainer(DanceGRPOTrainer):
    def _pre_fsdp_setup(self, cfg):
        super()._pre_fsdp_setup(cfg)
        if HOOKS["pre_fsdp"] is not None:
            HOOKS["pre_fsdp"](self)

    def _build_dataset(self, cfg):
        ds = InMemoryLatents(cfg.dataset_size or DATA["size"])
        return ds, DistributedSampler(ds, num_replicas=1, rank=0, shuffle=False, seed=cfg.seed)


def make_cfg(model: str, out: str, updates: int | None, **over) -> RLConfig:
    base = dict(
        model_path=model,
        latent_webdataset_dir="/nonexistent-precomputed",
        dataset_size=None,
        output_dir=out,
        auto_resume=False,
        save_steps=10_000,
        save_epoch_checkpoints=False,
        max_steps=updates,
        num_epochs=1,
        batch_size=1,
        num_workers=0,
        log_steps=1,
        warmup_steps=0,
        learning_rate=1e-4,
        fsdp=False,
        hsdp=False,
        adamw_fused=False,
        gradient_checkpointing=False,
        transformer_load_dtype="float32",
        param_dtype="float32",
        use_liger_kernel=False,
        attention_backend=None,
        torch_compile=False,
        wandb_project=None,
        grpo_group_size=4,
        grpo_sample_batch_size=4,
        grpo_num_sampling_steps=4,
        grpo_sde_formula="dancegrpo",
        grpo_sde_noise_scale=0.3,
        grpo_kl_coeff=0.004,
        grpo_clip_range=1e-3,
        grpo_reward_fn="ref_diff_injected",
        dancegrpo_share_group_init_noise=True,
        dancegrpo_timestep_selection_ratio=0.6,
        seed=42,
    )
    base.update(over)
    return RLConfig(**base)


def _modules(trainer) -> dict[str, torch.nn.Module]:
    pairs = zip(EXPERT_NAMES, (trainer.model.transformer, trainer.model.transformer_2))
    return {prefix: m for prefix, m in pairs if m is not None}


def run_reference(inp: str, out: str, fp32: bool = False, model: str | None = None) -> None:
    """The reference's own __init__ and train() on the inputs file; writes this rank's side file."""
    import torch.distributed as dist
    from src.trainer.dancegrpo_common import _shared_prompt_assignment

    d = torch.load(inp)
    s = d["set"]
    per_epoch, epochs, max_steps = plan_shape(s)
    C, F, H, W = d["shape"]
    G, T = s["G"], s["T"]
    # --fp32: inside src.models.wan_i2v the name torch.bfloat16 resolves to float32, which removes the reference's
    # bf16 casts of x_T and the trajectory (sde_generate) and of the timestep (_build_timestep_input).
    overrides = {"bfloat16": torch.float32} if fp32 else {}
    shared = shared_prompts(s)
    rank = int(os.environ.get("RANK", "0"))
    snap = {}

    def pre_fsdp(trainer):  # after the frozen reference copies, before FSDP shards the policy
        for prefix, m in _modules(trainer).items():
            perturb(m, s["perturb"], perturb_seed(prefix))
        snap["before"] = params(_modules(trainer))

    HOOKS["pre_fsdp"] = pre_fsdp
    if s["kind"] == "i2v_a14b":  # the condition is the mask and the first-frame latent of every latent frame
        conditions = [d["cond"][i] for i in range(per_epoch)]
    else:  # TI2V: the first latent frame, expanded over the latent frames
        conditions = [d["cond"][i].expand(C, F, H, W).contiguous() for i in range(per_epoch)]
    DATA["items"] = [
        dict(prompt_embeds=d["embeds"][i], video_latents=torch.zeros(C, F, H, W), condition=conditions[i])
        for i in range(per_epoch)
    ]
    cfg = make_cfg(
        str(model or model_dir(s)),
        str(WORK / "run_reference" / f"{Path(out).stem}_r{rank}"),
        max_steps,
        dataset_size=per_epoch,
        num_epochs=epochs,
        warmup_steps=s["warmup"],
        grpo_group_size=G,
        grpo_sample_batch_size=G,
        grpo_num_sampling_steps=T,
        grpo_sde_formula=s["sampler"],
        grpo_sde_noise_scale=s["eta"],
        grpo_cps_noise_scale_range=tuple(s["eta_range"]) if s["eta_range"] else None,
        grpo_kl_coeff=s["kl_coeff"],
        grpo_clip_range=s["clip_range"],
        grpo_shared_prompt_batch=shared,
        grpo_delayed_replay=s["delayed"],
        grpo_delayed_replay_clip_range=s["delayed_clip_range"] if s["delayed"] else None,
        learning_rate=s["lr"],
        weight_decay=s["weight_decay"],
        max_grad_norm=s["max_grad_norm"],
        dancegrpo_timestep_selection_ratio=s["fraction"],
        seed=s["seed"],
        save_steps=s["save_steps"],
        fsdp=bool(s["fsdp"]),
        tensor_parallel_size=s.get("tp", 1),
        train_experts="both",
    )
    tr = CPUDanceGRPOTrainer(cfg)
    world = tr.world_size
    before = snap["before"]
    tr._save_checkpoint = lambda *a, **k: None  # checkpoints are not compared
    members = _shared_prompt_assignment(tr.rank, world, 1, G)[3] if shared else list(range(G))
    st = dict(batch=-1, rolled=[], lp=[], grad_norm=None, metrics=None, step_batch={})
    rollouts, updates = {}, []
    REWARD["fn"] = lambda x: d["rewards"][st["batch"]][members].float()
    tr._sample_group_initial_latents = lambda condition, generator=None: d["init"][st["batch"]].unsqueeze(0)
    if s["eta_range"]:  # the project's per-prompt eta of the batch being rolled out (one prompt per batch)
        tr._sample_group_cps_noise_levels = lambda n, *, step, stream_id, device: torch.full(
            (n,), d["etas"][st["batch"]], dtype=torch.float32, device=device
        )
    # Replayed timesteps: update u (1-based) replays d["timesteps"][u]; train_state.step is u - 1 in the synchronous
    # paths, and the delayed path selects them when it rolls out step r, which update r + 1 replays.
    tr._select_training_timesteps = lambda n: list(d["timesteps"][int(tr.train_state.step) + 1])
    tr._select_training_timesteps_for_step = lambda n, step: list(d["timesteps"][int(step) + 1])
    q = NoiseQueue(overrides)
    orig_gen = tr.model.sde_generate

    def gen(**k):
        b = st["batch"]
        q.push(*[d["steps"][b][i][members] for i in range(T)])
        t0 = time.time()
        out_ = orig_gen(**k)
        rollouts[b] = dict(
            latents=torch.stack([x.float() for x in out_["latents"]], 1),
            log_probs=torch.stack([x.float() for x in out_["log_probs"]], 1),
            members=members,
            seconds=time.time() - t0,
        )
        st["rolled"].append(b)
        return out_

    tr.model.sde_generate = gen
    orig_prep = tr._prepare_shared_prompt_step_rollout

    def prep(batch, *, rollout_step, **k):
        st["step_batch"][int(rollout_step)] = st["batch"]
        return orig_prep(batch, rollout_step=rollout_step, **k)

    tr._prepare_shared_prompt_step_rollout = prep
    orig_tlp = tr._transition_log_prob

    def tlp(sample, mean, noise_scale):
        lp = orig_tlp(sample, mean, noise_scale)
        st["lp"].append(lp.detach().float().clone())
        return lp

    tr._transition_log_prob = tlp
    orig_clip = tr._clip_grad_norm

    def clip(mx):
        st["grad_norm"] = orig_clip(mx)
        return st["grad_norm"]

    tr._clip_grad_norm = clip
    orig_step = tr._grpo_step

    def step(batch):
        st["batch"] += 1
        st["t0"] = time.time()
        m = orig_step(batch)
        st["metrics"] = dict(m)
        return m

    tr._grpo_step = step
    modules = _modules(tr)
    by_prefix = dict(zip(EXPERT_NAMES, (tr.optimizer_1, tr.optimizer_2)))
    optimizers = {prefix: by_prefix[prefix] for prefix in modules}
    last = tr.optimizers[-1]
    for opt in tr.optimizers:

        def ostep(*a, _orig=opt.step, _opt=opt, **k):
            r = _orig(*a, **k)
            if _opt is not last:  # one record per update, once every optimizer has stepped
                return r
            m = st["metrics"]
            replayed = st["step_batch"][int(m["delayed_rollout_step"])] if "delayed_rollout_step" in m else st["batch"]
            m1, m2 = adam_state(modules, optimizers)
            metrics = dict(
                m,
                grad_norm=st["grad_norm"],
                learning_rate=_opt.param_groups[0]["lr"],
                ppo_clip_range=m.get("ppo_clip_range", cfg.grpo_clip_range),
                delayed_replay_staleness=m.get("delayed_replay_staleness", 0.0),
            )
            updates.append(
                dict(
                    update=len(updates) + 1,
                    replayed=replayed,
                    rolled_out=list(st["rolled"]),
                    seconds=time.time() - st["t0"],
                    metrics=metrics,
                    new_log_probs=torch.stack(st["lp"]),
                    params=params(modules),
                    exp_avg=m1,
                    exp_avg_sq=m2,
                )
            )
            st["rolled"].clear()
            st["lp"].clear()
            return r

        opt.step = ostep
    t0 = time.time()
    with q:
        tr.train()
    side = "vbvr" + ("-fp32" if fp32 else "")
    record = dict(
        side=side,
        set=s,
        rank=tr.rank,
        before=before,
        rollouts=rollouts,
        updates=updates,
        total=tr.total_steps,
        t_total=time.time() - t0,
    )
    torch.save(record, rank_suffix(out, tr.rank))
    if tr.rank == 0:
        for u in updates:
            keys = ("policy_loss", "kl_loss", "grad_norm", "learning_rate")
            print(
                f"{side} update {u['update']}:",
                json.dumps({k: u["metrics"].get(k) for k in keys}),
                "replayed",
                u["replayed"],
                "rolled out",
                u["rolled_out"],
            )
        print(f"{side}: {len(updates)} updates in {time.time() - t0:.2f}s")
    if dist.is_initialized():
        dist.destroy_process_group()


def reference_schedules(grid: list[dict], lr: float, clip: float, delayed_clip: float) -> list[dict]:
    """The reference's schedule for every grid point: its real train() loop, `_grpo_step` dispatch, delayed slot
    logic, `_compute_total_steps` and cosine lr; only the rollout and replay bodies are stubbed (no model call)
    and no checkpoint is written."""
    import types

    import src.trainer.base_grpo_trainer as bgt

    class _Dist(types.ModuleType):  # train() ends with destroy_process_group: keep the group for the next point
        def __getattr__(self, k):
            return getattr(torch.distributed, k)

    bgt.dist = _Dist("dist_proxy")
    bgt.dist.destroy_process_group = lambda *a, **k: None
    base = make_cfg(
        str(WORK / "tiny"),
        str(WORK / "run_plan"),
        None,
        dataset_size=2,
        grpo_kl_coeff=0.0,
        grpo_shared_prompt_batch=True,
        grpo_delayed_replay=True,
        learning_rate=lr,
        grpo_clip_range=clip,
        grpo_delayed_replay_clip_range=delayed_clip,
    )
    tr = CPUDanceGRPOTrainer(base)
    tr._save_checkpoint = lambda *a, **k: None
    log = {}
    zero = dict(
        policy_loss=0.0,
        kl_loss=0.0,
        reward_mean=0.0,
        reward_std=0.0,
        advantage_mean=0.0,
        ppo_clip_fraction=0.0,
        ppo_ratio_mean=1.0,
        ppo_ratio_abs_max=0.0,
        ppo_approx_kl=0.0,
    )

    def prep(batch, *, rollout_step, policy_version, selected_t_idxs):
        log["rolled"].append(log["batch"])
        log["step_batch"][int(rollout_step)] = log["batch"]
        return SimpleNamespace(
            rollout_step=rollout_step,
            policy_version=policy_version,
            prompt_batch_size=1,
            selected_t_idxs=selected_t_idxs,
            waves=[],
        )

    tr._prepare_shared_prompt_step_rollout = prep
    tr._replay_shared_prompt_step_rollout = lambda step_rollout, *, clip_range: dict(zero, ppo_clip_range=clip_range)
    orig_step = tr._grpo_step

    def step(batch):
        log["batch"] += 1
        if not tr.cfg.grpo_delayed_replay:  # synchronous: one rollout and one update per batch (body stubbed)
            log["rolled"].append(log["batch"])
            log["metrics"] = dict(zero, ppo_clip_range=tr.cfg.grpo_clip_range)
            return dict(log["metrics"])
        log["metrics"] = dict(orig_step(batch))
        return dict(log["metrics"])

    tr._grpo_step = step
    for opt in tr.optimizers:

        def ostep(*a, _orig=opt.step, _opt=opt, **k):
            m = log["metrics"]
            rep = log["step_batch"][int(m["delayed_rollout_step"])] if "delayed_rollout_step" in m else log["batch"]
            log["updates"].append(
                dict(
                    update=len(log["updates"]) + 1,
                    replayed=rep,
                    rolled_out=list(log["rolled"]),
                    staleness=m.get("delayed_replay_staleness", 0.0),
                    flush=bool(m.get("delayed_replay_flush", 1.0)),
                    clip=m["ppo_clip_range"],
                    lr=_opt.param_groups[0]["lr"],
                )
            )
            log["rolled"].clear()
            return _orig(*a, **k)

        opt.step = ostep
    runs = []
    for pt in grid:
        tr.cfg = base.model_copy(
            update=dict(
                dataset_size=pt["batches"],
                num_epochs=pt["epochs"],
                save_steps=pt["save_steps"],
                max_steps=pt["max_steps"],
                warmup_steps=pt["warmup"],
                grpo_delayed_replay=pt["delayed"],
            )
        )
        tr.dataset, tr.sampler = tr._build_dataset(tr.cfg)
        tr.dataloader = tr._build_dataloader(tr.dataset, tr.cfg)
        tr.total_steps = tr._compute_total_steps()
        tr.train_state.step = tr.train_state.epoch = tr.train_state.batch_idx = 0
        tr._delayed_shared_prompt_rollout = None
        log.update(batch=-1, rolled=[], step_batch={}, updates=[], metrics=None)
        tr.train()
        runs.append(dict(point=pt, total=tr.total_steps, updates=log["updates"]))
    torch.distributed.destroy_process_group()
    return runs
