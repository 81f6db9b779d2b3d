"""A recipe checked at its real scale on one CPU (`videogrpo simulate`): the real-shape transformer(s), torch's fake
process group at the recipe's world size, and this project's own mesh, FSDP2/HSDP and tensor-parallel code.

For each checked rank (the first, the last, the first rank of every HSDP shard group or FSDP replica block, and
TP peers in pairs) it
- builds the transformer(s) on the meta device and wraps them with `Experts.build`, as training does, on a fake
  group of rank r in a world of W (collectives move no data; meshes, groups and shards are torch's own);
- compares every parameter's local shard and FSDP's padded allocation with parallel.shard_layout, the arithmetic
  the memory plan counts with, and the rank's master weights, gradients and AdamW moments (bytes torch
  allocated, observed) with the plan's terms for that rank: they must be equal, padding included;
- runs one rollout step (the sampler over the transformer's velocity, `grpo.rollout.rollout`) and one replay
  step (`replay_log_prob`, the PPO objective, backward through FSDP2, AdamW's step) per trained expert on fake
  tensors (torch's FakeTensorMode: shapes, dtypes and devices, no data), with the rows of this rank's first
  rollout chunk at the recipe's video shape;
- builds the DCP checkpoint's save plan (`grpo.checkpoint.dcp_state`, torch's default save planner: keys and
  shard metadata, no data) and checks every sharded parameter's chunk against the rank's local shard.

What fake tensors cannot run is named, not skipped silently: values read back as Python numbers (the PPO
diagnostics of `ppo_loss`, the clipping norm `Experts.step` logs) are data the fake tensors do not hold, so the
replay step uses `ppo_objective` (the same loss) and steps each AdamW directly. torch.compile is left off (it would
trace the fake tensors), and the text encoder and VAE are not built (their memory is the plan's "frozen models").
A config whose world size breaks the recipe's arithmetic is refused when it loads, with preflight's message.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

from videogrpo.config import Config
from videogrpo.errors import VideoGRPOError
from videogrpo.parallel import shard_layout
from videogrpo.preflight import memory_plan, model_shape

TERMS = ("master weights", "gradients", "AdamW moments", "old policy", "EMA")
DEFAULT_SHIFT = 5.0
"""The sigma schedule's flow shift where grpo.shift is null (the model's own is in its scheduler config, not read
here): it only decides which steps the simulated rollout and replay take, hence which expert serves them."""


class SimulationMismatch(VideoGRPOError):
    """What torch built at the recipe's scale differs from what the memory plan and the layout arithmetic say."""


@dataclass
class RankResult:
    rank: int
    layout: shard_layout.RankLayout
    parameters: int
    held: int
    """Elements of this rank's local shards (DTensor.to_local)."""
    observed: dict[str, int] = field(default_factory=dict)
    planned: dict[str, int] = field(default_factory=dict)
    dcp_items: int = 0
    steps: list[str] = field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        lay = self.layout
        where = f"fsdp {lay.fsdp_rank}/{lay.fsdp_degree}" + (f" tp {lay.tp_rank}/{lay.tp}" if lay.tp > 1 else "")
        gib = memory_plan.gib
        terms = ", ".join(
            f"{name} {gib(self.observed[name])}"
            + (" = plan" if self.observed[name] == self.planned[name] else f" != plan {gib(self.planned[name])}")
            for name in TERMS
            if name in self.observed
        )
        steps = "; ".join(self.steps) or "no steps"
        verdict = "ok" if not self.problems else f"{len(self.problems)} problem(s)"
        return (
            f"rank {self.rank:>4} ({where}): {self.parameters} parameters, {self.held:,} elements held; {terms}; "
            f"DCP plan {self.dcp_items} items; {steps}; {self.seconds:.1f} s: {verdict}"
        )


def ranks_to_check(cfg: Config) -> list[int]:
    """The first and last rank, the first rank of every HSDP shard group (or, under FSDP, of every block of 8 data
    replicas), and with tensor parallelism each such rank's TP peers: where an off-by-one in a mesh shows."""
    par, world = cfg.parallel, cfg.train_world_size  # with rollout actors, the train ranks
    tp = max(1, par.tensor_parallel)
    stride = par.shard_group_size if par.data_parallel == "hsdp" else 8
    firsts = set(range(0, world // tp, stride)) | {world // tp - 1}
    return sorted({replica * tp + peer for replica in firsts for peer in range(tp)})


def trained_shapes(cfg: Config) -> dict[str, dict]:
    """Each trained transformer's constructor arguments (models/shapes.py) by expert name: the tiny model's for
    model.source tiny, the released models' otherwise."""
    from videogrpo.models import shapes

    tiny = cfg.model.source == "tiny"
    if cfg.model.kind != "i2v_a14b":
        return {"transformer": dict(shapes.TINY_TI2V if tiny else shapes.WAN_TI2V_5B)}
    from videogrpo.models.i2v import EXPERTS

    expert = dict(shapes.TINY_I2V_EXPERT if tiny else shapes.WAN_I2V_A14B_EXPERT)
    return {name: expert for name in (EXPERTS if cfg.train.experts == "both" else (cfg.train.experts,))}


def simulated_shape(cfg: Config, shapes: dict[str, dict]) -> model_shape.ModelShape:
    """The memory plan's view of the simulated transformers (their parameter shapes, each trained expert's) and of
    the model kind's latent geometry; the frozen models are not built, so they count no parameters here."""
    from videogrpo.models.shapes import LATENT_GEOMETRY

    counts = tuple(model_shape.ParamCounts.from_shapes(model_shape.config_shapes(s)) for s in shapes.values())
    geo = LATENT_GEOMETRY[cfg.model.kind]
    config = next(iter(shapes.values()))
    experts = counts if len(counts) > 1 else ()
    shape = model_shape.ModelShape(config, counts[0], 0, geo["z_dim"], geo["spatial"], geo["temporal"], experts)
    if cfg.train.lora_rank > 0:  # the adapters Experts.build adds: the only parameters with gradients and moments
        shape = model_shape.with_lora(shape, cfg.train.lora_rank, cfg.train.lora_targets)
    return shape


def simulation_config(cfg: Config) -> Config:
    """The config the simulated ranks run: the recipe's, on the fake group's backend, on CPU, not compiled."""
    from videogrpo.parallel.fsdp import FAKE_BACKEND

    sim = copy.deepcopy(cfg)
    sim.parallel.backend = FAKE_BACKEND
    sim.parallel.device = "cpu"
    sim.parallel.compile = False
    return sim


def simulate(
    cfg: Config, ranks: list[int] | None = None, steps: bool = True, log=print, jobs: int = 1
) -> list[RankResult]:
    """Check `ranks` (default `ranks_to_check`) of the recipe `cfg`, `jobs` ranks at a time; SimulationMismatch lists
    every difference. With rollout actors the train ranks are simulated (ranks 0 .. train ranks - 1): an actor holds
    the policy whole and builds no mesh (its memory: preflight/actor_memory.py)."""
    world = cfg.train_world_size
    ranks = ranks_to_check(cfg) if ranks is None else ranks
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise VideoGRPOError(f"--ranks {bad}: the world size is {world} (ranks 0 to {world - 1})")
    shapes = trained_shapes(cfg)
    model_shape = simulated_shape(cfg, shapes)
    latent = model_shape.latent_shape(cfg.video.num_frames, cfg.video.height, cfg.video.width)
    par = cfg.parallel
    log(
        f"simulating {cfg.recipe}: world {world} ({par.nodes} nodes x {par.procs_per_node}), {par.data_parallel}"
        + (f" in groups of {par.shard_group_size}" if par.data_parallel == "hsdp" else "")
        + (f", tensor_parallel {par.tensor_parallel}" if par.tensor_parallel > 1 else "")
        + f"; {len(shapes)} transformer(s) of {model_shape.trained // len(shapes):,} parameters; ranks {ranks}"
        + (f"; the {world} train ranks of {cfg.world_size} (the others are rollout actors)" if cfg.has_actors else "")
    )

    def start(rank: int):
        layout = shard_layout.rank_layout(par.data_parallel, world, par.shard_group_size, par.tensor_parallel, rank)
        planned = shard_layout.sharded_state_bytes(model_shape, layout)
        planned |= {name: planned["weight copy"] for name in memory_plan.weight_copies_of(cfg)}
        return _start_own_process(_simulate_rank, cfg, rank, layout, shapes, planned, latent if steps else None)

    # Up to `jobs` ranks at a time, each in its own process; reported in rank order as each finishes.
    results, running, pending = [], [], list(ranks)
    while pending or running:
        while pending and len(running) < max(1, jobs):
            running.append((pending[0], start(pending.pop(0))))
        rank, handle = running.pop(0)
        result = _finish_own_process(handle, rank)
        log(result.line())
        for problem in result.problems[:20]:
            log(f"  - {problem}")
        results.append(result)
    problems = [f"rank {r.rank}: {p}" for r in results for p in r.problems]
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise SimulationMismatch(
            f"{cfg.recipe} at world size {world}: {len(problems)} difference(s) between torch's sharding and the "
            "plan:\n  " + "\n  ".join(problems[:20]) + more
        )
    return results


def _start_own_process(function, *args):
    """`function(*args)` in a forked child that sends its result back (`_finish_own_process` receives it): every
    simulated rank gets a fresh torch.distributed (torch keeps a mesh's coordinates per process, so a second rank set
    up in one process would get the first's)."""
    import multiprocessing
    import traceback

    import torch  # noqa: F401  imported once here, before the fork, so each child starts with it loaded

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(("ok", function(*args)))
        except BaseException as err:  # noqa: BLE001  sent to the parent, which raises it
            send.send(("error", (err, traceback.format_exc())))

    process = context.Process(target=child)
    process.start()
    send.close()
    return process, receive


def _finish_own_process(handle, rank: int):
    process, receive = handle
    try:
        status, value = receive.recv()
    except EOFError:
        process.join()
        raise VideoGRPOError(f"the simulated rank {rank}'s process died (exit code {process.exitcode})") from None
    process.join()
    if status == "error":
        err, trace = value
        if isinstance(err, VideoGRPOError):
            raise err
        raise RuntimeError(f"simulating rank {rank} failed:\n{trace}") from err
    return value


def _simulate_rank(cfg, rank, layout, shapes, planned, latent: tuple[int, ...] | None) -> RankResult:
    """One rank in this process: the layout checks, then (with a `latent` shape, else none) the steps."""
    import torch
    import torch.distributed as dist
    from diffusers import WanTransformer3DModel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from videogrpo.grpo.experts import Experts

    started = time.monotonic()
    sim = simulation_config(cfg)
    dist.init_process_group(sim.parallel.backend, store=FakeStore(), rank=rank, world_size=cfg.train_world_size)
    try:
        raw = {}
        for name, shape in shapes.items():
            with torch.device("meta"):
                raw[name] = WanTransformer3DModel(**shape)
        experts = Experts.build(raw, cfg.model.kind == "i2v_a14b", sim, cfg.train_world_size, torch.device("cpu"))
        result = RankResult(rank, layout, 0, 0, planned=planned)
        allocated = 0
        for expert in experts.experts:
            allocated += _check_shards(expert.module, layout, result)
        result.observed["master weights"] = 4 * allocated
        _check_dcp_plan(experts, rank, result)  # on the meta device, before the steps make AdamW's state
        for expert in experts.experts:  # the plan made AdamW's state on the meta device; the steps make their own
            expert.optimizer.state.clear()
        if latent is not None:
            from torch._subclasses.fake_tensor import FakeTensorMode
            from torch.fx.experimental.symbolic_shapes import ShapeEnv

            from videogrpo.grpo.samplers import sigma_schedule

            # Python floats, computed before the fake mode: rollout reads each sigma as a number.
            sigmas = sigma_schedule(cfg.grpo.sampling_steps, cfg.grpo.shift or DEFAULT_SHIFT).tolist()

            # A shape environment lets ops whose output size depends on values (the frame mask's boolean indexing)
            # run with a symbolic size.
            with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
                for expert in experts.experts:
                    _materialize(expert)
                _run_steps(cfg, sim, rank, experts, sigmas, latent, result)
        result.problems += [
            f"{name}: torch holds {result.observed[name]:,} bytes, the memory plan counts {planned[name]:,}"
            for name in TERMS
            if name in result.observed and result.observed[name] != planned[name]
        ]
    finally:
        dist.destroy_process_group()
    result.seconds = time.monotonic() - started
    return result


def _materialize(expert) -> None:
    """The expert's parameters as fake CPU tensors. FSDP2 keeps its sharded parameter objects through to_empty; an
    unsharded module gets new ones (a meta tensor cannot take a fake one's data), so the expert's parameter list
    and its AdamW (which has no state yet) are pointed at them."""
    expert.module.to_empty(device="cpu")
    expert.params[:] = [p for p in expert.module.parameters() if p.requires_grad]
    (group,) = expert.optimizer.param_groups
    group["params"] = list(expert.params)


def _fsdp_allocations(module) -> dict[int, int]:
    """id(sharded parameter) -> elements FSDP2 allocated for it (its padded shard), over every FSDP-wrapped module."""
    from torch.distributed.fsdp import FSDPModule

    out = {}
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            group = sub._get_fsdp_state()._fsdp_param_group  # torch's own record of what it allocated
            for fsdp_param in group.fsdp_params if group is not None else ():
                out[id(fsdp_param.sharded_param)] = fsdp_param._sharded_param_data.numel()
    return out


def _check_shards(module, layout, result: RankResult) -> int:
    """Every parameter's local shape and allocation against shard_layout; returns the elements allocated."""
    allocations = _fsdp_allocations(module)
    total = 0
    for name, param in module.named_parameters():
        local = tuple(param.to_local().shape) if hasattr(param, "to_local") else tuple(param.shape)
        expected_local = shard_layout.local_shape(name, tuple(param.shape), layout)
        expected_alloc, _ = shard_layout.local_numels(name, tuple(param.shape), layout)
        got_alloc = allocations.get(id(param), math.prod(local))  # what FSDP does not hold is its local shard
        if local != expected_local or got_alloc != expected_alloc:
            result.problems.append(
                f"{name} {list(param.shape)}: local shard {list(local)} allocating {got_alloc:,}, the layout "
                f"arithmetic says {list(expected_local)} allocating {expected_alloc:,}"
            )
        result.parameters += 1
        result.held += math.prod(local)
        total += got_alloc
    return total


def _run_steps(cfg, sim, rank, experts, sigmas: list[float], latent: tuple[int, ...], result: RankResult) -> None:
    """One rollout step and one replay step per trained expert, on fake tensors, with this rank's first chunk's rows."""
    import torch

    from videogrpo.grpo import nft, offload, rollout, weight_copy
    from videogrpo.grpo.assignment import waves
    from videogrpo.grpo.flops import video_tokens
    from videogrpo.grpo.loss import guard_log_ratio, ppo_objective

    device = torch.device("cpu")
    routed = cfg.model.kind == "i2v_a14b"
    if routed:
        from videogrpo.models.i2v import WanI2VA14B, expert_schedule

        model = WanI2VA14B.without_frozen_models(experts.policy, device, sim)
    else:
        from videogrpo.models.wan import WanTI2V

        model = WanTI2V.without_frozen_models(experts.policy, device, sim)
    g = cfg.grpo
    wave = waves(cfg, rank, cfg.train_world_size)[0]
    rows = len(offload.rollout_chunks(wave, g.sample_batch_size)[0])
    first = next(iter(experts.policy.values() if routed else [experts.policy]))
    text_dim = first.config.text_dim
    embeds = torch.randn(rows, cfg.model.max_text_tokens, text_dim).to(model.compute_dtype)
    if routed:
        condition = torch.randn(rows, 4 + latent[0], *latent[1:])  # the mask's 4 channels, the first frame's latent
        schedule = expert_schedule(sigmas, model.boundary, model.loaded)
        indices = [schedule.index(name) for name in model.loaded]
    else:
        condition = torch.randn(rows, latent[0], 1, *latent[2:])
        indices = [0]
    etas = torch.full((rows,), float(g.eta))
    old = None
    for name in memory_plan.weight_copies_of(cfg):  # the copies of the trained shards, as the trainer makes them
        copy = weight_copy.WeightCopy(experts.params, list(experts.modules().values()))
        locals_ = [c.to_local() if hasattr(c, "to_local") else c for c in copy.copies]
        result.observed[name] = sum(t.numel() * t.element_size() for t in locals_)
        old = copy if name == "old policy" else old
    tokens = video_tokens(latent, tuple(first.config.patch_size))
    for index in indices:
        pair = sigmas[index : index + 2]
        trajectory = rollout.rollout(
            model,
            experts.policy,
            embeds,
            condition,
            torch.randn(rows, *latent),
            pair,
            g.sampler,
            etas,
            lambda i: torch.randn(rows, *latent),
            g.guidance_scale,
            keep_means=g.grpo_guard,
        )
        if old is not None:  # DiffusionNFT: the clean latent noised at the step's sigma, the old policy beside
            x = nft.noised(trajectory.latents[:, -1], pair[0], torch.randn(rows, *latent))
            guided = (embeds, g.guidance_scale, condition if routed else None)
            with torch.no_grad(), old.swapped_in():
                v_old = rollout.velocity(model, experts.policy, x.to(model.trajectory_dtype), pair[0], *guided)
            v = rollout.velocity(model, experts.policy, x.to(model.trajectory_dtype), pair[0], *guided)
            x0, advantages = trajectory.latents[:, -1], torch.randn(rows)
            loss, *_ = nft.nft_objective(v, v_old, x, x0, pair[0], advantages, g.nft_beta, g.nft_adv_clip)
        else:
            new = rollout.replay_log_prob(
                model, experts.policy, trajectory, 0, pair, g.sampler, embeds, g.guidance_scale,
                condition if routed else None,
            )  # fmt: skip
            new_lp, old_lp = new.log_prob, trajectory.log_probs[:, 0]
            if g.grpo_guard:  # the normalised ratio on the recorded transition means
                per_row = g.grpo_guard_scope == "row"
                new_lp = guard_log_ratio(new_lp, old_lp, new.mean, trajectory.means[:, 0], new.std, per_row=per_row)
                old_lp = torch.zeros_like(new_lp)
            loss, _, _ = ppo_objective(new_lp, old_lp, torch.randn(rows), g.clip_range)
        loss.backward()
        which = f" ({schedule[index]} expert)" if routed else ""
        what = "NFT" if old else "replay"
        result.steps.append(f"rollout + {what} at step {index}{which}: {rows} rows x {tokens:,} tokens")
    grads = {}
    for expert in experts.experts:
        for p in expert.params:
            if p.grad is not None:
                local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                storage = local.untyped_storage()
                grads[id(storage)] = storage.nbytes()
    result.observed["gradients"] = sum(grads.values())
    for expert in experts.experts:
        expert.optimizer.step()  # Experts.step also clips, reading the norm as a number: not on fake tensors
    moments = 0
    for expert in experts.experts:
        for state in expert.optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                value = state[key]
                local = value.to_local() if hasattr(value, "to_local") else value
                moments += local.numel() * local.element_size()
    result.observed["AdamW moments"] = moments
    result.steps.append("AdamW step")


def _check_dcp_plan(experts, rank: int, result: RankResult) -> None:
    """The DCP save plan of this rank (keys and chunks, no data): every sharded parameter's chunk is the local shard
    the layout arithmetic says, at the offset it says."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    from videogrpo.grpo.checkpoint import dcp_state

    state = dcp_state(experts.parts(), with_optim=True)
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=rank == 0)
    plan = planner.create_local_plan()
    result.dcp_items = len(plan.items)
    chunks = {item.index.fqn: item.tensor_data.chunk for item in plan.items if item.tensor_data is not None}
    for expert in experts.experts:
        base = "model." if len(experts.experts) == 1 else f"{expert.name}.model."
        for name, param in expert.module.named_parameters():
            if not hasattr(param, "to_local") or not param.requires_grad:  # a LoRA base is in no checkpoint
                continue
            expected = (
                shard_layout.local_shape(name, tuple(param.shape), result.layout),
                shard_layout.global_offset(name, tuple(param.shape), result.layout),
            )
            chunk = chunks.get(base + name)
            if chunk is None:
                result.problems.append(f"DCP save plan: no chunk of {base + name}")
            elif (tuple(chunk.sizes), tuple(chunk.offsets)) != expected:
                result.problems.append(
                    f"DCP save plan: {base + name} chunk {list(chunk.sizes)} at {list(chunk.offsets)}, the layout "
                    f"arithmetic says {list(expected[0])} at {list(expected[1])}"
                )
    result.steps.append("DCP save plan")
