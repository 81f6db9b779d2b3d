"""Rollout actor ranks (the `actors` section, docs/options.md#rollout-actors): the first ranks of the job train, the
others roll out and score the batches for them.

A batch's rollouts are cut into pieces: one per wave of each train rank (`assignment.waves` at the train ranks'
world), the rows a train rank would roll out itself without actors. Piece k goes to actor k mod A (A actors). Every
draw is keyed by batch, prompt and member, so an actor's rollout of a row is the one the train rank would have
made, and a train rank replays, data-parallel, exactly the rows of a job of train ranks alone: the synchronous mode
makes the updates such a job makes.

Which batch is dealt when, and under which weights, is `actor_schedule`'s: a function of the run's plan, so the
rollouts do not depend on the actors' timing. Synchronous mode: each batch is dealt after the update before it, under
its weights. Asynchronous mode: up to actors.prefetch batches are dealt ahead, under the weights collected every
actors.sync_interval updates; each update records its batch's policy version and staleness, and the PPO ratio is
taken against the log-probabilities the actor recorded.

Per batch dealt (`Feed`): the train ranks gather the weights the rollouts are sampled with (the policy's trained
tensors, LoRA's adapters only; DiffusionNFT's old policy) when a batch needs a version not yet collected; the train
root posts each actor its pieces of the batch, with the weights if its own are of another version; each actor rolls
out, decodes and scores its pieces in order and posts each to its train rank (the trajectory, the text embeddings,
the rewards, the weights' version); each train rank receives its own pieces when it prepares the batch. The rewards
reach the trainer as the scorer's results would (`ReceivedScores`), so the advantages, the replay and the update are
the trainer's own. A checkpoint keeps the weights of the batches dealt or still to deal under older versions, so a
resume deals them as the uninterrupted run did.

May import: `grpo` modules below the trainer, `models`, `rewards`, `data`, `parallel` and the core modules.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass

import torch

from videogrpo.data.dataset import batch_for_step, load_split, training_order
from videogrpo.grpo import actor_schedule, assignment, checkpoint, lora, offload, rollout_batch
from videogrpo.grpo.rollout import Trajectory
from videogrpo.grpo.rollout_batch import Chunk
from videogrpo.grpo.samplers import sigma_schedule
from videogrpo.parallel.link import Outbox, Posted

Row = tuple[int, int]
COMPILED = "_orig_mod."
"""What torch.compile puts in a module's parameter names (left out of the names the weights travel by)."""


def pieces(cfg, train_world: int) -> list[tuple[int, int, list[Row]]]:
    """(train rank, wave index, rows) of every piece of a batch, in the order they are dealt and received."""
    return [(r, w, rows) for r in range(train_world) for w, rows in enumerate(assignment.waves(cfg, r, train_world))]


def actor_of(piece: int, train_world: int, job_world: int) -> int:
    """The job rank of the actor that rolls out piece `piece`."""
    return train_world + piece % (job_world - train_world)


def weight_sync(cfg) -> str:
    """actors.weight_sync resolved: `auto` is `lora` under LoRA, else `full`."""
    if cfg.actors.weight_sync == "auto":
        return "lora" if lora.enabled(cfg) else "full"
    return cfg.actors.weight_sync


def travel_name(name: str) -> str:
    return name.replace(COMPILED, "")


class ReceivedScores:
    """A train rank's scorer with actors: the actors scored its rollouts, and `collect` hands back their results
    (the futures of a received piece are its results)."""

    def submit(self, request):
        raise RuntimeError("a train rank does not score with rollout actors: the actors score their rollouts")

    def collect(self, futures: list) -> list[dict]:
        return list(futures)

    def close(self, kill: bool = False) -> None:
        pass


# ---- the train side ------------------------------------------------------------------------------------------


def rollout_weights(trainer) -> dict[str, torch.Tensor]:
    """The weights the rollouts are sampled with, whole, on the host, by name (`weight_name`), in the compute dtype
    (what an actor holds): each expert's trained tensors (LoRA: the adapters), DiffusionNFT's old policy swapped in.
    A collective under FSDP: every train rank calls it; the train root's are fresh copies (the others' may be
    empty)."""
    from videogrpo.models.wan import DTYPES
    from videogrpo.parallel import fsdp

    experts = trainer.experts
    dtype = DTYPES[trainer.cfg.parallel.param_dtype]
    sampling = trainer.nft_old.swapped_in() if trainer.nft_old is not None else contextlib.nullcontext()
    weights = {}
    with sampling:  # only the trained tensors are gathered: under LoRA, not the frozen base
        for expert in experts.experts:
            for name, tensor in fsdp.trained_state_dict(expert.module).items():
                # A copy: an unsharded model's gathered tensors are its parameters, which the next update changes.
                weights[weight_name(expert.name, name, experts.routed)] = tensor.to(dtype, copy=True)
    return weights


def weight_name(expert: str, name: str, routed: bool) -> str:
    """A trained tensor's name on the link: the A14B's prefixed by its expert (`high.`, `low.`)."""
    return f"{expert}.{travel_name(name)}" if routed else travel_name(name)


class Feed:
    """The train ranks' side of the actors: which batches are dealt when and under which weights (actor_schedule),
    the weights collected when a batch to deal needs them (the train root keeps them until no batch does), each
    actor sent the weights only when its own are behind, and each train rank's pieces received."""

    def __init__(self, trainer, start: int, kept: dict[int, dict[str, torch.Tensor]]):
        """`start`: the first action this run does; `kept`: the weights a resumed checkpoint kept, by version (the
        train root's; empty on the others)."""
        cfg = trainer.cfg
        self.trainer, self.link = trainer, trainer.ctx.link
        self.sync = weight_sync(cfg)
        self.prefetch, self.interval = actor_schedule.prefetch(cfg), actor_schedule.sync_interval(cfg)
        self.done = actor_schedule.updates_before(trainer.actions)
        everything = actor_schedule.schedule(trainer.actions, self.prefetch, self.interval)
        self.dispatches = [d for d in everything if d.action >= start]
        self.by_batch = {d.batch: d for d in self.dispatches}
        self.collected = actor_schedule.versions_kept(everything, self.done, start) if self.sync != "none" else set()
        self.weights = kept
        if trainer.ctx.is_main and (missing := sorted(self.collected - set(kept))):
            raise RuntimeError(f"the resumed checkpoint lacks the rollout weights of version(s) {missing}")
        self.dealt = 0
        """How many of `dispatches` have been dealt."""
        self.taken = 0
        """How many of `dispatches` this rank has received (in their order, the order batches are prepared)."""
        self.actor_versions: dict[int, int] = {}
        self.outbox = Outbox()
        self.actors = list(range(self.link.train_world, self.link.world))
        self.pieces = pieces(cfg, self.link.train_world)
        """Every batch's pieces (the same for each): who rolls out which is fixed for the run."""
        self.dealt_to = {
            a: [k for k in range(len(self.pieces)) if actor_of(k, self.link.train_world, self.link.world) == a]
            for a in self.actors
        }

    def advance(self, index: int) -> None:
        """At loop index `index` (the actions before it done): collect the current weights if a batch dealt from
        now on is rolled out under them, then deal every batch due. Every train rank calls it at the same points.
        (Along the schedule both the dealing points and the versions only grow: each scan stops early.)"""
        current = self.done[index]
        if self.sync != "none" and current not in self.collected and self._pending_uses(current):
            weights = rollout_weights(self.trainer)
            self.collected.add(current)
            if self.trainer.ctx.is_main:
                self.weights[current] = weights
        while self.dealt < len(self.dispatches) and self.dispatches[self.dealt].at <= index:
            if self.trainer.ctx.is_main:
                self._deal(self.dealt)
            self.dealt += 1
        # The oldest batch not yet received needs the oldest version still in use: older ones are dropped.
        oldest = self.dispatches[self.taken].version if self.taken < len(self.dispatches) else math.inf
        for version in [v for v in self.weights if v < oldest]:
            del self.weights[version]

    def _pending_uses(self, version: int) -> bool:
        for d in self.dispatches[self.dealt :]:
            if d.version >= version:
                return d.version == version
        return False

    def _deal(self, i: int) -> None:
        d = self.dispatches[i]
        # Whether the next batch is dealt before this one is replayed: an actor may then keep this batch's last piece
        # until it has rolled out the next batch's first (no wait on this batch can hold up the next one's deal).
        carry = i + 1 < len(self.dispatches) and self.dispatches[i + 1].at <= d.action
        for a in self.actors:
            sent = self.weights[d.version] if self.sync != "none" and self.actor_versions.get(a) != d.version else None
            header = {
                "kind": "batch",
                "batch": d.batch,
                "version": d.version,
                "pieces": self.dealt_to[a],
                "weights": sent is not None,
                "carry": carry,
            }
            self.outbox.add(self.link.post(a, header, sent))
            if self.sync != "none":
                self.actor_versions[a] = d.version
        # An actor has taken the jobs dealt `prefetch` batches ago (their rollouts were received): free their bytes.
        self.outbox.settle(keep=self.prefetch * len(self.actors))

    def version(self, batch: int) -> int:
        """The version of the weights batch `batch` is rolled out under (without weight sync: the initial ones)."""
        return self.by_batch[batch].version if self.sync != "none" else 0

    def receive(self, trainer, batch: int, prompts: list) -> list[Chunk]:
        """This rank's pieces of `batch` (rollout_batch.prepare's `receive`), as the chunks it would have rolled
        out; each must come from the weights the schedule says."""
        ctx, link, version = trainer.ctx, self.link, self.version(batch)
        if self.taken >= self.dealt or self.dispatches[self.taken].batch != batch:
            raise RuntimeError(
                f"batch {batch} is not the next batch dealt to the actors (the schedule and the trainer disagree)"
            )
        chunks = []
        for k, (r, w, rows) in enumerate(self.pieces):
            if r != ctx.rank:
                continue
            src = actor_of(k, link.train_world, link.world)
            header, tensors = link.recv(src, f"the rollouts of batch {batch}, wave {w}")
            got = (header["batch"], header["wave"], header["rows"], header["version"])
            if got != (batch, w, rows, version):
                raise RuntimeError(
                    f"rank {ctx.rank}: expected batch {batch} wave {w} rows {rows} rolled out by weights version "
                    f"{version}, rank {src} sent batch {got[0]} wave {got[1]} rows {got[2]} by version {got[3]} (the "
                    "actors and the train ranks disagree on the pieces or the weights)"
                )
            chunks.append(received_chunk(trainer, prompts, header, tensors))
        self.taken += 1
        return chunks

    def staleness(self, action, prepared) -> dict:
        """An update's record of its batch's rollouts: the weights' version they were rolled out under and the
        updates taken since (within the schedule's bound, or the run stops: the actors were not in step)."""
        staleness = action.update - 1 - prepared.policy_version
        bound = actor_schedule.staleness_bound(self.prefetch, self.interval, self.trainer.cfg.grpo.delayed_replay)
        if self.sync != "none" and not 0 <= staleness <= bound:
            raise RuntimeError(
                f"update {action.update}: batch {prepared.batch} was rolled out under the weights of update "
                f"{prepared.policy_version}, {staleness} updates behind; the actors' schedule allows at most {bound}"
            )
        return {"rollout_policy_version": prepared.policy_version, "rollout_staleness": staleness}

    def kept(self, index: int) -> dict[int, dict[str, torch.Tensor]]:
        """What a checkpoint taken before loop index `index` keeps (the train root's): the weights of the batches
        dealt or to deal from `index` on, other than the current ones, so that a resume deals them alike."""
        if self.sync == "none" or not self.trainer.ctx.is_main:
            return {}
        return {v: self.weights[v] for v in sorted(actor_schedule.versions_kept(self.dispatches, self.done, index))}

    def stop(self) -> None:
        """The end of training: the train root tells every actor the run is over, then the pieces dealt and not
        replayed (training stopped early) are received and dropped (an actor sends a piece it kept on the stop)."""
        trainer = self.trainer
        if trainer.ctx.is_main:
            for a in self.actors:
                self.outbox.add(self.link.post(a, {"kind": "stop"}))
        while self.taken < self.dealt:
            batch = self.dispatches[self.taken].batch
            self.receive(trainer, batch, batch_for_step(trainer.order, trainer.cfg.grpo.prompts_per_step, batch)[1])
        self.outbox.settle()


def kept_weights(checkpoint_dir, is_main: bool) -> dict[int, dict[str, torch.Tensor]]:
    """The rollout weights a resumed checkpoint kept (Feed.kept), on the train root; none on the others or on a
    fresh start."""
    if checkpoint_dir is None or not is_main:
        return {}
    if "rollout_weights" not in checkpoint.read_state(checkpoint_dir).get("host_files", []):
        return {}
    return checkpoint.load_host_file(checkpoint_dir, "rollout_weights")


def received_chunk(trainer, prompts, header: dict, tensors: dict) -> Chunk:
    """A piece as the trainer's chunk: its trajectory on the compute device, then parked where offload says."""
    dev = trainer.ctx.device
    trajectory = Trajectory(
        tensors["latents"].to(dev),
        tensors["log_probs"].to(dev),
        tensors["etas"].to(dev),
        tensors["means"].to(dev) if "means" in tensors else None,
    )
    rows = header["rows"]
    return Chunk(
        [j for j, _ in rows],
        [g for _, g in rows],
        [prompts[j] for j, _ in rows],
        trainer.placement.park(trajectory),
        trainer.placement.park_tensor(tensors["embeds"].to(dev)),
        trainer.placement.park_tensor(tensors["condition"].to(dev)) if "condition" in tensors else None,
        futures=header["results"],
    )


# ---- the actor side ------------------------------------------------------------------------------------------


@dataclass
class ActorState:
    """What `rollout_batch.rollout_wave` reads of a trainer, for an actor: its model with an unsharded frozen policy,
    its scorer, the schedule."""

    cfg: object
    ctx: object
    model: object
    policy: torch.nn.Module | dict
    """The frozen policy: one transformer, or the A14B's experts by name (its velocity routes each step)."""
    placement: offload.Placement
    scorer: object
    order: list
    sigmas: torch.Tensor
    shift: float
    shape: tuple
    nft_old: None = None
    refiners: None = None
    """No prompt refiners on an actor (refused with actors: config/refiners_section.py)."""
    scores: bool = True
    version: int = 0
    """The version of the weights it holds (the initial ones until the train root sends others)."""

    @property
    def experts(self):
        return self

    @classmethod
    def build(cls, cfg, paths, ctx) -> ActorState:
        from videogrpo.models.i2v import WanI2VA14B
        from videogrpo.models.wan import DTYPES, WanTI2V, flow_shift, tile_decoding
        from videogrpo.rewards.terms import training_scorer

        frozen_device = offload.HOST if cfg.train.offload_inference_models else None
        if cfg.model.kind == "i2v_a14b":
            if ctx.device.type == "cuda":  # as the trainer: SDPA without its cuDNN kernel
                torch.backends.cuda.enable_cudnn_sdp(False)
            model = WanI2VA14B.from_config(paths.model, ctx.device, cfg, frozen_device, cfg.train.experts)
        else:
            model = WanTI2V.from_config(paths.model, ctx.device, cfg, frozen_device)
        tile_decoding(model.vae, cfg.grpo.vae_tile_size)
        experts = dict(model.trainable)
        for index, module in enumerate(experts.values()):
            if lora.enabled(cfg):  # the same adapters as the train ranks', so that theirs load by name
                lora.add_adapters(module, cfg, index)
            # Frozen and whole, in the compute dtype: what FSDP's mixed-precision policy gathers on a train rank.
            module.requires_grad_(False).eval().to(DTYPES[cfg.parallel.param_dtype])
        routed = not model.pins_first_frame  # the A14B's velocity routes each step to an expert, as the trainer's
        placement = offload.Placement(
            ctx.device,
            cfg.train.offload_inference_models,
            {"text_encoder": model.text_encoder, "vae": model.vae},
            {"text_encoder": [model.text_encoder], "vae": [model.vae.encoder, model.vae.decoder]},
        )
        order = training_order(load_split(paths.dataset, "rl"), cfg.data.shuffle_seed)
        shift, _ = flow_shift(cfg, paths.model)
        return cls(
            cfg,
            ctx,
            model,
            experts if routed else next(iter(experts.values())),
            placement,
            training_scorer(cfg, paths.evalkit, sorted({s.task for s in order})),
            order,
            sigma_schedule(cfg.grpo.sampling_steps, shift),
            shift,
            model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width).shape,
        )

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """The train ranks' weights into the frozen policy, by name; every one must be known."""
        routed = isinstance(self.policy, dict)
        experts = self.policy if routed else {"transformer": self.policy}
        params = {weight_name(expert, n, routed): p for expert, m in experts.items() for n, p in m.named_parameters()}
        unknown = sorted(set(weights) - set(params))
        if unknown:
            raise RuntimeError(f"actor rank {self.ctx.rank}: the train ranks sent weights it has not: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor.to(params[name].dtype))


def run_actor(cfg, paths, ctx) -> None:
    """An actor's life: wait for the train root's next batch (with weights when behind), roll out, decode and score
    its pieces, send each to its train rank; until the train root says stop. A piece is sent once the next one is
    rolled out (its scoring overlaps that rollout), so a train rank waits at most about two pieces' work for each;
    in the asynchronous mode the last piece of a batch waits for the next batch's first. Sends are posted, not waited
    for: in the asynchronous mode the actor goes on to the next batch dealt while the train ranks have yet to take
    this one's."""
    link = ctx.link
    state = ActorState.build(cfg, paths, ctx)
    dealt = pieces(cfg, link.train_world)
    jobs: list[Outbox] = []
    keep = actor_schedule.prefetch(cfg) - 1
    carried = None
    """(outbox, batch, piece) of a batch's last piece, sent once the next batch's first piece is rolled out (when the
    train root says the next batch is dealt before this one is replayed: its scoring then overlaps that rollout)."""

    def release(held) -> None:
        """Send a kept piece, if any, into its batch's outbox; None: nothing is kept after."""
        if held is not None:
            held[0].add(send_piece(state, *held[1:]))
        return None

    print(f"[rank {ctx.rank}] rollout actor of {link.train_world} train ranks", file=sys.stderr, flush=True)
    try:
        while True:
            header, weights = link.recv(0, "the next batch from the train root", bounded=False)
            # The train ranks have taken the pieces of every batch dealt `prefetch` batches before this one.
            while len(jobs) > keep:
                jobs.pop(0).settle()
            if header["kind"] == "stop":
                release(carried)  # training stopped before the next batch was dealt
                for outbox in jobs:
                    outbox.settle()
                return
            if header["weights"]:
                state.load(weights)
                state.version = header["version"]
            batch, outbox = header["batch"], Outbox()
            _, prompts = batch_for_step(state.order, cfg.grpo.prompts_per_step, batch)
            waiting = None
            for k in header["pieces"]:
                r, w, rows = dealt[k]
                with torch.no_grad():
                    chunk = rollout_batch.rollout_wave(state, batch, prompts, rows)  # submitted for scoring
                if waiting is not None:
                    outbox.add(send_piece(state, batch, *waiting))
                carried = release(carried)  # the last batch's last piece, scored while this one rolled out
                waiting = (state.version, r, w, rows, chunk)  # the weights that rolled it out, kept with it
            carried = release(carried)
            if waiting is not None and header["carry"]:
                carried = (outbox, batch, *waiting)
            elif waiting is not None:
                outbox.add(send_piece(state, batch, *waiting))
            jobs.append(outbox)
    finally:
        state.scorer.close()


def send_piece(state: ActorState, batch: int, version: int, rank: int, wave: int, rows: list[Row], chunk) -> Posted:
    """A rolled-out piece posted to its train rank, once scored: the trajectory, the text embeddings, the rewards,
    and the version of the weights that rolled it out."""
    results = state.scorer.collect(chunk.futures)
    trajectory = chunk.trajectory
    tensors = {"latents": trajectory.latents, "log_probs": trajectory.log_probs, "etas": trajectory.etas}
    tensors["embeds"] = chunk.embeds
    if trajectory.means is not None:
        tensors["means"] = trajectory.means
    if chunk.condition is not None:
        tensors["condition"] = chunk.condition
    message = {"batch": batch, "wave": wave, "rows": rows, "results": results, "version": version}
    return state.ctx.link.post(rank, message, tensors)


def describe(cfg) -> str:
    """The trainer's line for the actors ("" without)."""
    if not cfg.has_actors:
        return ""
    train, world = cfg.train_world_size, cfg.world_size
    return (
        f"rollout actors: ranks 0..{train - 1} train, ranks {train}..{world - 1} ({world - train}) roll out and "
        f"score, {actor_schedule.describe(cfg)}, weights sent as {weight_sync(cfg)}"
    )
