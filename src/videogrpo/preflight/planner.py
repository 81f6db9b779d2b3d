"""The layouts a recipe can train in on a given set of GPUs, each with its memory plan and a modelled time per update
(`videogrpo plan`).

A layout is everything that changes where bytes live or how work is cut, never what an update computes: FSDP or HSDP
and their shard groups, tensor parallelism, the prompts a rank serves (from the world size: grpo.assignment), the
rollout and replay chunk (grpo.sample_batch_size), the decode batch, gradient checkpointing, frozen-model offload and
optimizer and gradient offload. Each candidate is checked by the config's own checks (a layout the trainer would
refuse is never offered) and planned by preflight's memory plan (`memory_plan.plan_for_config`), so that a written
layer gives preflight the same plan. Where no layout fits, contract changes (LoRA, fewer prompts, a smaller group,
fewer frames) are searched separately and shown as what they are: another run.

The time model, per update and every assumption printed and settable (`Assumptions`):
- compute: the update's transformer FLOPs (grpo.flops: replay with gradients and the rollout) over the world's peak
  bf16 FLOP/s at a stated MFU;
- collectives, not overlapped with compute (an upper bound): FSDP's all-gather of the compute-dtype weights per
  forward (and again for the backward), its reduce-scatter of gradients per backward, HSDP's all-reduce across shard
  groups per backward, replicate's one all-reduce per optimizer update, and tensor parallelism's two activation
  all-reduces per block per forward and backward; inside a node at the NVLink bandwidth, across nodes at the
  network's;
- host copies over PCIe: the frozen models to the device and back once per wave when offloaded, and the optimizer
  state's two copies per optimizer update when offloaded;
- a fixed cost per video of a scoring rank (decoding, encoding and the reward), fitted with the MFU to the only
  GPU measurements of this training code (docs/what-fits.md lists them beside the model).

May import: `config`, `grpo`, `models`, `parallel`, `preflight.memory_plan`, `preflight.simulate` and the core modules.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass, field

from videogrpo.config import Config, checks
from videogrpo.errors import ConfigError
from videogrpo.grpo import assignment, minibatches, offload, sde_window
from videogrpo.grpo.flops import StepFlops, forward_flops, step_flops, video_tokens
from videogrpo.models import shapes
from videogrpo.parallel import shard_layout
from videogrpo.preflight import memory_plan
from videogrpo.preflight.memory_plan import GIB
from videogrpo.preflight.model_shape import ModelShape
from videogrpo.preflight.plan_assumptions import GPU_MEMORY_GIB, TUNABLE, Assumptions  # noqa: F401


@dataclass(frozen=True)
class Layout:
    """One way to place the recipe's training on the GPUs: the config fields it sets."""

    nodes: int
    procs_per_node: int
    data_parallel: str
    shard_group_size: int
    tensor_parallel: int
    sample_batch_size: int | None
    decode_batch_size: int | None
    gradient_checkpointing: bool
    offload_inference_models: bool
    offload_optimizer: bool
    offload_gradients: bool
    batch_size: int

    def layer(self, gpu_memory_gib: float) -> dict:
        """The config layer of this layout (what `videogrpo plan --write` writes)."""
        return {
            "parallel": {
                "nodes": self.nodes,
                "procs_per_node": self.procs_per_node,
                "data_parallel": self.data_parallel,
                "shard_group_size": self.shard_group_size,
                "tensor_parallel": self.tensor_parallel,
                "offload_optimizer": self.offload_optimizer,
                "offload_gradients": self.offload_gradients,
                "device_memory_gib": gpu_memory_gib,
            },
            "grpo": {"sample_batch_size": self.sample_batch_size, "decode_batch_size": self.decode_batch_size},
            "train": {
                "batch_size": self.batch_size,
                "gradient_checkpointing": self.gradient_checkpointing,
                "offload_inference_models": self.offload_inference_models,
            },
        }

    def describe(self) -> str:
        mesh = (
            f"hsdp {self.shard_group_size}"
            if self.data_parallel == "hsdp"
            else ("fsdp" if self.data_parallel == "fsdp" else self.data_parallel)
        )
        parts = [mesh + (f" x tp {self.tensor_parallel}" if self.tensor_parallel > 1 else "")]
        parts.append(f"chunk {self.sample_batch_size or 'wave'}")
        parts.append(f"decode {self.decode_batch_size or 'wave'}")
        parts.append("ckpt" if self.gradient_checkpointing else "no-ckpt")
        offloads = [
            name
            for name, on in (
                ("frozen", self.offload_inference_models),
                ("optim", self.offload_optimizer),
                ("grads", self.offload_gradients),
            )
            if on
        ]
        parts.append("offload " + "+".join(offloads) if offloads else "no offload")
        return ", ".join(parts)


@dataclass
class Row:
    layout: Layout
    cfg: Config
    plan: memory_plan.MemoryPlan
    host_per_node: int
    seconds: dict[str, float]
    prompts_per_rank: int
    members_per_prompt: int
    breaks: str = ""
    """Why it does not fit ("" when it fits)."""
    contract: dict = field(default_factory=dict)
    """The contract fields changed to get here (empty: the recipe's own training)."""

    @property
    def fits(self) -> bool:
        return not self.breaks

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


def released_shape(cfg: Config) -> ModelShape:
    """The memory plan's view of the recipe's released model, from configs on the meta device (nothing downloaded):
    the trained transformer(s) (models/shapes.py) and the frozen text encoder and VAE (shapes.FROZEN_MODELS)."""
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    from videogrpo.preflight.simulate import simulated_shape, trained_shapes

    shape = simulated_shape(cfg, trained_shapes(cfg))
    if cfg.model.source == "tiny":
        return shape
    text, vae = shapes.FROZEN_MODELS[cfg.model.kind]
    vae_args = {k: list(v) if isinstance(v, tuple) else v for k, v in vae.items()}
    with torch.device("meta"):
        frozen = sum(p.numel() for p in UMT5EncoderModel(UMT5Config(**text)).parameters())
        frozen += sum(p.numel() for p in AutoencoderKLWan(**vae_args).parameters())
    return dataclasses.replace(shape, frozen_params=frozen, vae=vae_args)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(cfg: Config, gpus: int, nodes: int) -> list[Layout]:
    """Every layout of the search, before the config checks (which refuse some: `plan` counts them)."""
    per_node = gpus // nodes
    g = cfg.grpo
    found = []
    heads = shapes.WAN_I2V_A14B_EXPERT if cfg.model.kind == "i2v_a14b" else shapes.WAN_TI2V_5B
    tps = [t for t in (1, 2, 4, 8) if t <= per_node and heads["num_attention_heads"] % t == 0]
    for tp in tps:
        replicas = gpus // tp
        meshes = [("fsdp", 1)] + [("hsdp", s) for s in divisors(replicas) if 1 < s < replicas] if replicas > 1 else []
        meshes = meshes or [("replicate", 1)]
        # Outside shared-prompt mode a data replica takes train.batch_size prompts: kept at the step's prompts.
        batch = cfg.train.batch_size
        if not g.shared_prompts and g.prompts_per_step % replicas == 0:
            batch = g.prompts_per_step // replicas
        members = members_per_rank(cfg, gpus, tp)
        chunks = sorted({None, *[d for d in divisors(members) if d < members]}, key=lambda c: c or members + 1)
        for (mesh, group), chunk, checkpointing, frozen_off, optim in itertools.product(
            meshes, chunks, (True, False), (True, False), ("none", "optimizer", "optimizer+gradients")
        ):
            for decode in sorted({1, chunk or members}):
                found.append(
                    Layout(
                        nodes,
                        per_node,
                        mesh,
                        group if mesh == "hsdp" else cfg.parallel.shard_group_size,
                        tp,
                        chunk,
                        decode if decode != members else None,
                        checkpointing,
                        frozen_off,
                        optim != "none",
                        optim == "optimizer+gradients",
                        batch,
                    )
                )
    return found


def members_per_rank(cfg: Config, gpus: int, tp: int) -> int:
    """Group members of one prompt a rank rolls out (shared-prompt mode), or rows of a data replica's batch."""
    g = cfg.grpo
    if g.shared_prompts:
        wave = g.prompts_per_wave or g.prompts_per_step
        return g.group_size // (gpus // wave) if gpus >= wave and gpus % wave == 0 else g.group_size
    return g.group_size


def update_flops(cfg: Config, shape: ModelShape) -> StepFlops:
    """The transformer FLOPs of one update of `cfg` (a rollout batch and its replay: every optimizer update it takes)
    at the model shape `shape`, all ranks together (grpo/flops.py; a window's mean rollout forwards)."""
    g = cfg.grpo
    latent = shape.latent_shape(cfg.video.num_frames, cfg.video.height, cfg.video.width)
    config = shape.transformer
    tokens = video_tokens(latent, tuple(config["patch_size"]))
    per_sample = forward_flops(
        config,
        tokens,
        cfg.model.max_text_tokens,
        per_token_timestep=cfg.model.kind == "ti2v",
        lora_rank=cfg.train.lora_rank,
        lora_targets=cfg.train.lora_targets,
    )
    return step_flops(
        per_sample,
        tokens,
        g.prompts_per_step * g.group_size,
        sde_window.trained_steps(g),
        sde_window.mean_rollout_forwards(g),
        True,
        g.guidance_scale > 1.0,
        g.kl_coeff > 0,
        cfg.train.gradient_checkpointing,
        old_policy=g.algorithm == "nft",
        passes=g.update_passes,
    )


def modelled_seconds(cfg: Config, shape: ModelShape, assume: Assumptions) -> dict[str, float]:
    """The time model of one update (the module docstring), by part."""
    g, par = cfg.grpo, cfg.parallel
    world, tp = cfg.world_size, max(1, par.tensor_parallel)
    latent = shape.latent_shape(cfg.video.num_frames, cfg.video.height, cfg.video.width)
    config = shape.transformer
    tokens = video_tokens(latent, tuple(config["patch_size"]))
    timesteps = sde_window.trained_steps(g)
    guidance = g.guidance_scale > 1.0
    step = update_flops(cfg, shape)
    compute = (step.train + step.inference) / (world * assume.peak_flops * assume.mfu)

    # This rank's forwards: rollout chunks x steps, replay chunks x trained timesteps (forward, recompute, backward).
    # Several updates a batch replay each update's rows chunk by chunk, padded to the most any rank runs under FSDP
    # (grpo.minibatches; the sets of the first batch).
    rank_waves = assignment.waves(cfg, 0, world)
    chunks = sum(len(offload.rollout_chunks(w, g.sample_batch_size)) for w in rank_waves)
    updates = minibatches.update_sets(g, cfg.train.seed, 0)
    replayed = sum(len(minibatches.rank_forwards(cfg, rank_waves, world, rows)) for _, rows in updates)
    rows = max(len(c) for w in rank_waves for c in offload.rollout_chunks(w, g.sample_batch_size))
    branches = 2 if guidance else 1
    rollout_forwards = chunks * sde_window.mean_rollout_forwards(g)  # fewer with a DPM-Solver tail
    # DiffusionNFT asks the old policy too: one more forward, without gradients, per replayed chunk and step.
    replay_forwards = replayed * timesteps * ((2 if cfg.train.gradient_checkpointing else 1) + (g.algorithm == "nft"))
    backwards = replayed * timesteps
    params = shape.params.total // tp
    c, r = memory_plan.BYTES[par.param_dtype], memory_plan.BYTES[par.reduce_dtype]
    replicas = world // tp
    shard = shard_layout.sharding_degree(par.data_parallel, replicas, par.shard_group_size)
    per_node = par.procs_per_node

    def bandwidth(span: int) -> float:  # ranks a collective spans, consecutive: inside a node if they fit in one
        return (assume.nvlink_gbps if span * tp <= per_node else assume.network_gbps) * 1e9

    comm = 0.0
    if shard > 1:
        gather = c * params * (shard - 1) / shard
        comm += (rollout_forwards + replay_forwards + backwards) * gather / bandwidth(shard)
        comm += backwards * r * params * (shard - 1) / shard / bandwidth(shard)
        if replicas > shard:  # HSDP: the shard groups all-reduce their shards
            groups = replicas // shard
            comm += backwards * 2 * r * (params / shard) * (groups - 1) / groups / bandwidth(replicas)
    elif replicas > 1:  # one all-reduce per optimizer update
        comm += len(updates) * 2 * 4 * params * (replicas - 1) / replicas / bandwidth(replicas)
    if tp > 1:
        d = config["num_attention_heads"] * config["attention_head_dim"]
        activation = rows * branches * tokens * d * c * 2 * (tp - 1) / tp
        comm += (rollout_forwards + replay_forwards + backwards) * 2 * config["num_layers"] * activation / bandwidth(1)
    host = 0.0
    if cfg.train.offload_inference_models:
        host += len(rank_waves) * 2 * shape.frozen_params * memory_plan.BYTES[cfg.model.frozen_dtype]
    if par.offload_optimizer:  # per optimizer update
        host += len(updates) * 2 * 4 * shape.trainable / max(1, shard * tp)
    scoring_rows = sum(len(w) for w in rank_waves)
    return {
        "compute": compute,
        "collectives": comm,
        "host copies": host / (assume.pcie_gbps * 1e9),
        "videos": scoring_rows * assume.video_overhead_s,
    }


def host_bytes_per_node(cfg: Config, shape: ModelShape, plan: memory_plan.MemoryPlan) -> int:
    """Host memory of a node's ranks: the plan's host terms, the frozen models parked there and the trajectories
    offloaded there (train.offload_inference_models), per rank, times the ranks of a node."""
    per_rank = plan.host_bytes
    if cfg.train.offload_inference_models:
        if not any(t.name == "frozen models" for t in plan.host_terms):
            per_rank += shape.frozen_params * memory_plan.BYTES[cfg.model.frozen_dtype]
        latent = shape.latent_shape(cfg.video.num_frames, cfg.video.height, cfg.video.width)
        _, batch, _ = memory_plan.rows_per_rank(cfg, cfg.world_size)
        t = memory_plan.BYTES[cfg.parallel.param_dtype if cfg.grpo.trajectory_dtype == "compute" else "float32"]
        per_row = (cfg.grpo.sampling_steps + 1) * math.prod(latent) * t
        per_rank += per_row * batch * (2 if cfg.grpo.delayed_replay else 1)
    return per_rank * cfg.parallel.procs_per_node


def evaluate(cfg: Config, layout: Layout, shape: ModelShape, assume: Assumptions, gpu_gib: float, host_gib):
    """The row of one layout, or the config check's first problem (a layout the trainer would refuse)."""
    laid = with_changes(cfg, layout.layer(gpu_gib))
    if found := checks.problems(laid):
        return found[0]
    plan = memory_plan.plan_for_config(laid, shape)
    host = host_bytes_per_node(laid, shape, plan)
    breaks = ""
    limit = plan.available * (1 - assume.headroom)
    if plan.peak > limit:
        phase = max(plan.phases, key=plan.phase_total)
        largest = max((t for t in plan.terms if phase in t.phases), key=lambda t: t.bytes)
        kept = f", {assume.headroom:.0%} kept free" if assume.headroom else ""
        breaks = (
            f"device: peak {memory_plan.gib(plan.peak)} > {memory_plan.gib(limit)}{kept} "
            f"({phase}; largest term {largest.name} {memory_plan.gib(largest.bytes)})"
        )
    elif host_gib is not None and host > host_gib * GIB:
        breaks = f"host: {memory_plan.gib(host)} a node > {host_gib:g} GiB"
    rank_waves = assignment.waves(laid, 0, laid.world_size)
    prompts = len({j for w in rank_waves for j, _ in w})
    return Row(
        layout,
        laid,
        plan,
        host,
        modelled_seconds(laid, shape, assume),
        prompts,
        sum(len(w) for w in rank_waves) // max(1, prompts),
        breaks,
    )


def search(
    cfg: Config,
    gpus: int,
    nodes: int,
    gpu_gib: float,
    host_gib: float | None,
    assume: Assumptions,
    shape: ModelShape | None = None,
) -> tuple[list[Row], list[Row], dict[str, int]]:
    """(rows that fit, best modelled time first; rows that do not, nearest first; refusals by the config check's
    message, counted)."""
    shape = shape or released_shape(cfg)
    fitting, failing, refused = [], [], {}
    for layout in candidate_layouts(cfg, gpus, nodes):
        row = evaluate(cfg, layout, shape, assume, gpu_gib, host_gib)
        if isinstance(row, str):
            refused[row] = refused.get(row, 0) + 1
        elif row.fits:
            fitting.append(row)
        else:
            failing.append(row)
    fitting.sort(key=ranking)
    failing.sort(key=lambda r: (r.plan.peak - (r.plan.available or 0), r.host_per_node, r.total_s))
    return fitting, failing, refused


VAE_TILE = 256
"""The tile a contract change proposes (diffusers' default tile; a multiple of every VAE's 4 x spatial factor)."""


def contract_changes(cfg: Config, gpus: int | None = None) -> list[tuple[str, dict]]:
    """Changes of what an update computes that make it smaller, each a new run: LoRA, half the prompts per step,
    half the group, fewer frames, the VAE decoding in tiles (its pixels are blended where tiles meet); and, where
    `gpus` data replicas cannot share the recipe's prompts per step, the nearest counts of prompts they can."""
    g, t, v = cfg.grpo, cfg.train, cfg.video
    out = []
    if t.lora_rank == 0 and cfg.parallel.tensor_parallel == 1:
        out += [(f"train.lora_rank = {r}", {"train": {"lora_rank": r}}) for r in (64, 16)]
    half = g.prompts_per_step // 2 if g.prompts_per_step > 1 and g.prompts_per_step % 2 == 0 else None
    if half:
        wave = g.prompts_per_wave if g.prompts_per_wave and half % g.prompts_per_wave == 0 else None
        out.append((f"grpo.prompts_per_step = {half}", {"grpo": {"prompts_per_step": half, "prompts_per_wave": wave}}))
    replicas = (gpus or 0) // cfg.parallel.tensor_parallel
    if replicas > 1 and g.prompts_per_step % replicas:
        below = g.prompts_per_step // replicas * replicas
        for count in (below, below + replicas):  # one wave of the whole step, a whole number of prompts a replica
            if count and count != half:
                change = {"grpo": {"prompts_per_step": count, "prompts_per_wave": None}}
                out.append((f"grpo.prompts_per_step = {count} (a multiple of {replicas} replicas)", change))
    if g.group_size >= 4 and g.group_size % 2 == 0:
        out.append((f"grpo.group_size = {g.group_size // 2}", {"grpo": {"group_size": g.group_size // 2}}))
    frames = (v.num_frames - 1) // 2 // 4 * 4 + 1
    if frames >= 5 and frames != v.num_frames:
        out.append((f"video.num_frames = {frames}", {"video": {"num_frames": frames}}))
    if g.vae_tile_size is None and max(v.height, v.width) > VAE_TILE:
        out.append((f"grpo.vae_tile_size = {VAE_TILE}", {"grpo": {"vae_tile_size": VAE_TILE}}))
    return out


def with_changes(cfg: Config, changes: dict) -> Config:
    """A copy of `cfg` with the fields of `changes` ({section: {field: value}}: a layout's layer or a contract
    change) set."""
    out = copy.deepcopy(cfg)
    for section, values in changes.items():
        for key, value in values.items():
            setattr(getattr(out, section), key, value)
    return out


# ---- what `videogrpo plan` prints -------------------------------------------------------------------------------

HEADER = (
    f"{'':>3} {'layout':<58} {'prompts/rank':>12} {'rollout':>8} {'replay':>8} {'host/node':>10} {'s/update':>9}  "
    "compute + collectives + host copies + videos"
)


def row_line(index: str, row: Row) -> str:
    gib = lambda b: f"{b / GIB:.1f}"  # noqa: E731
    parts = " + ".join(f"{v:.0f}" for v in row.seconds.values())
    share = f"{row.prompts_per_rank} x {row.members_per_prompt}"
    return (
        f"{index:>3} {row.layout.describe():<58} {share:>12} {gib(row.plan.phase_total(memory_plan.ROLLOUT)):>8} "
        f"{gib(row.plan.phase_total(memory_plan.REPLAY)):>8} {gib(row.host_per_node):>10} {row.total_s:>9.0f}  {parts}"
        + (f"\n{'':>3} breaks: {row.breaks}" if row.breaks else "")
    )


def distinct(rows: list[Row], top: int) -> list[Row]:
    """The first `top` rows that differ in what they cost (peak, host memory or time): of layouts that cost the same,
    the first, which the sort made the one with the fewest offloads."""
    seen, out = set(), []
    for row in rows:
        cost = (round(row.plan.peak / GIB, 2), round(row.host_per_node / GIB, 1), round(row.total_s))
        but_decode = dataclasses.replace(row.layout, decode_batch_size=None)  # another decode batch: not a new row
        if cost not in seen and but_decode not in seen:
            seen.update((cost, but_decode))
            out.append(row)
        if len(out) == top:
            break
    return out


def offloads(layout: Layout) -> int:
    return layout.offload_inference_models + layout.offload_optimizer + layout.offload_gradients


def ranking(row: Row) -> tuple:
    """Fitting rows, best first: by modelled time in steps of 2 % (finer than the model can tell apart), then the
    fewest offloads, then decoding the whole chunk at once (the time model does not count decoding), then the lowest
    peak."""
    small_decode = row.layout.decode_batch_size not in (None, row.layout.sample_batch_size)
    bucket = round(math.log(max(row.total_s, 1e-9)) / math.log(1.02))
    return (bucket, offloads(row.layout), small_decode, row.plan.peak)


def weights_floor_problem(cfg: Config, shape: ModelShape, gpus: int, gpu_gib: float) -> str | None:
    """A GPU too small for the one term no layout moves: the float32 master weights' share of each GPU."""
    share = 4 * shape.trained / gpus
    if share <= gpu_gib * GIB:
        return None
    return (
        f"--gpu-memory {gpu_gib:g}: a GPU is smaller than its share of the float32 master weights, "
        f"4 B x {shape.trained:,} parameters / {gpus} GPU(s) = {share / GIB:.1f} GiB, which no layout moves off it; "
        "use more GPUs"
    )


@dataclass
class Outcome:
    lines: list[str]
    fitting: list[Row]
    contract_rows: list[Row]


def plan_lines(
    cfg: Config,
    gpus: int,
    nodes: int,
    gpu_gib: float,
    host_gib: float | None,
    assume: Assumptions,
    top: int = 5,
    shape: ModelShape | None = None,
    changes: bool = False,
) -> Outcome:
    """Everything `videogrpo plan` prints: the assumptions, the fitting layouts (best modelled time first), the
    nearest that do not fit with what breaks each, and, where none fits (or with `changes`), the contract changes that
    do (labelled)."""
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: give at least 1 GPU")
    if nodes < 1 or gpus % nodes:
        raise ConfigError(f"--nodes {nodes}: must be at least 1 and divide --gpus {gpus}")
    shape = shape or released_shape(cfg)
    if problem := weights_floor_problem(cfg, shape, gpus, gpu_gib):
        raise ConfigError(problem)
    g, v = cfg.grpo, cfg.video
    lines = [
        f"planning {cfg.recipe}: {cfg.model.kind}, {g.prompts_per_step} prompts x {g.group_size} members a step, "
        f"{v.num_frames}x{v.height}x{v.width}, on {gpus} GPU(s) of {gpu_gib:g} GiB ({nodes} node(s) x {gpus // nodes})"
        + (
            f", {host_gib:g} GiB host memory a node"
            if host_gib is not None
            else ", host memory not limited (--host-memory)"
        ),
        "assumptions of the time model (each an option):",
        *(f"  {line}" for line in assume.lines()),
    ]
    fitting, failing, refused = search(cfg, gpus, nodes, gpu_gib, host_gib, assume, shape)
    runs_at_all = bool(fitting or failing)
    if runs_at_all:
        fitting.sort(key=ranking)
        candidates = len(fitting) + len(failing) + sum(refused.values())
        lines.append(
            f"{len(fitting)} of {candidates} layouts fit ({sum(refused.values())} refused by the config's checks); "
            f"peaks in GiB per GPU by phase, modelled seconds per update:"
        )
        lines.append(HEADER)
    else:  # the topology itself is refused (a world size the waves do not divide): only a contract change can help
        lines.append(f"no layout of {cfg.recipe} runs on {gpus} GPU(s): {next(iter(refused))}")
    shown = distinct(fitting, top)
    if runs_at_all:
        lines += [row_line(str(i + 1), row) for i, row in enumerate(shown)] or ["    none fits"]
        lines.append("nearest that do not fit:")
        lines += [row_line("-", row) for row in distinct(failing, 3)] or ["    none"]
    contract_rows, still = [], []
    if changes or not fitting:
        found_lines = []
        for label, change in contract_changes(cfg, gpus):
            changed = with_changes(cfg, change)
            found, _, _ = search(changed, gpus, nodes, gpu_gib, host_gib, assume, released_shape(changed))
            if found:
                found.sort(key=ranking)
                found[0].contract = change
                contract_rows.append(found[0])
                found_lines.append(row_line(f"c{len(contract_rows)}", found[0]) + f"\n{'':>3} with {label}")
            else:
                still.append(label)
        if not runs_at_all and not contract_rows:
            raise ConfigError(f"{lines[-1].removeprefix('no layout of ')}; and no contract change tried fits either")
        if contract_rows:
            lines.append("contract changes that fit (each a new run, not the recipe's training):")
            lines += ([] if runs_at_all else [HEADER]) + found_lines
        lines.append(
            f"contract changes that do not fit either: {'; '.join(still)}"
            if still
            else "every contract change tried fits"
        )
    return Outcome(lines, shown, contract_rows)


def layer_text(row: Row, gpu_gib: float, source: str) -> str:
    """The YAML layer of a row, with a header saying what wrote it and what it keeps."""
    import yaml

    layer = row.layout.layer(gpu_gib)
    for section, values in row.contract.items():
        layer.setdefault(section, {}).update(values)
    kept = "changes the training contract: a new run" if row.contract else "keeps the recipe's training contract"
    head = (
        f"# written by `videogrpo plan` for {source}: {row.layout.describe()}; peak {row.plan.peak / GIB:.2f} GiB a "
        f"GPU, modelled {row.total_s:.0f} s an update. Layer it after the recipe (--configfile RECIPE THIS); it "
        f"{kept}.\n"
    )
    return head + yaml.safe_dump(layer, sort_keys=False)
