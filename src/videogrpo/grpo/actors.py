"""Rollout actor ranks (the `actors` section, docs/options.md#rollout-actors): the first ranks of the job train, the
others roll out and score the batches for them.

A batch's rollouts are cut into pieces: one per wave of each train rank (`assignment.waves` at the train ranks'
world), the rows a train rank would roll out itself without actors. Piece k goes to actor k mod A (A actors). Every
draw is keyed by batch, prompt and member, so an actor's rollout of a row is the one the train rank would have
made, and a train rank replays, data-parallel, exactly the rows of a job of train ranks alone: the synchronous mode
makes the updates such a job makes.

Synchronous mode, per batch the trainer prepares: the train ranks gather the weights the rollouts are sampled with
(the policy's trained tensors, LoRA's adapters only; DiffusionNFT's old policy) when an actor's are behind; the
train root sends each actor its pieces of the batch, with the weights if it is behind; each actor rolls out, decodes
and scores its pieces in order and sends each to its train rank (the trajectory, the text embeddings, the rewards);
each train rank receives its own pieces. The rewards reach the trainer as the scorer's results would
(`ReceivedScores`), so the advantages, the replay and the update are the trainer's own.

May import: `grpo` modules below the trainer, `models`, `rewards`, `data`, `parallel` and the core modules.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from videogrpo.data.dataset import batch_for_step, load_split, training_order
from videogrpo.grpo import assignment, lora, offload, rollout_batch
from videogrpo.grpo.rollout import Trajectory
from videogrpo.grpo.rollout_batch import Chunk
from videogrpo.grpo.samplers import sigma_schedule

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
    """The weights the rollouts are sampled with, whole, on the host, by name: the policy's trained tensors
    (LoRA: the adapters), DiffusionNFT's old policy swapped in. A collective under FSDP: every train rank calls it."""
    from videogrpo.parallel import fsdp

    (expert,) = trainer.experts.experts  # the A14B's two experts are refused with actors (config checks)
    sampling = trainer.nft_old.swapped_in() if trainer.nft_old is not None else contextlib.nullcontext()
    with sampling:  # only the trained tensors are gathered: under LoRA, not the frozen base
        trained = fsdp.trained_state_dict(expert.module)
    return {travel_name(n): t for n, t in trained.items()}


def receive_pieces(trainer, batch: int, prompts: list) -> list[Chunk]:
    """The train side of a batch (rollout_batch.prepare's `receive`): the weights sent to the actors that are behind,
    each actor's pieces dealt (by the train root), this rank's pieces received as the chunks it would have rolled
    out."""
    cfg, ctx, link = trainer.cfg, trainer.ctx, trainer.ctx.link
    actors = range(link.train_world, link.world)
    version = trainer.policy_version
    behind = [a for a in actors if trainer.actor_versions.get(a) != version]
    sync = weight_sync(cfg)
    weights = rollout_weights(trainer) if behind and sync != "none" else None
    dealt = pieces(cfg, link.train_world)
    if ctx.is_main:
        for a in actors:
            mine = [k for k in range(len(dealt)) if actor_of(k, link.train_world, link.world) == a]
            sent = weights if weights is not None and a in behind else None
            header = {"kind": "batch", "batch": batch, "version": version, "pieces": mine, "weights": sent is not None}
            link.send(a, header, sent)
    if sync != "none":
        trainer.actor_versions.update(dict.fromkeys(actors, version))
    chunks = []
    for k, (r, w, rows) in enumerate(dealt):
        if r != ctx.rank:
            continue
        header, tensors = link.recv(
            actor_of(k, link.train_world, link.world), f"the rollouts of batch {batch}, wave {w}"
        )
        if (header["batch"], header["wave"], header["rows"]) != (batch, w, rows):
            raise RuntimeError(
                f"rank {ctx.rank}: expected batch {batch} wave {w} rows {rows}, got batch {header['batch']} wave "
                f"{header['wave']} rows {header['rows']} (the actors and the train ranks disagree on the pieces)"
            )
        chunks.append(received_chunk(trainer, prompts, header, tensors))
    return chunks


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


def stop_actors(trainer) -> None:
    """The train root tells every actor the run is over (a normal end of training)."""
    link = trainer.ctx.link
    if link is not None and trainer.ctx.is_main:
        for a in range(link.train_world, link.world):
            link.send(a, {"kind": "stop"})


# ---- the actor side ------------------------------------------------------------------------------------------


@dataclass
class ActorState:
    """What `rollout_batch.rollout_wave` reads of a trainer, for an actor: its model with an unsharded frozen policy,
    its scorer, the schedule."""

    cfg: object
    ctx: object
    model: object
    policy: torch.nn.Module
    placement: offload.Placement
    scorer: object
    order: list
    sigmas: torch.Tensor
    shift: float
    shape: tuple
    nft_old: None = None
    scores: bool = True

    @property
    def experts(self):
        return self

    @classmethod
    def build(cls, cfg, paths, ctx) -> ActorState:
        from videogrpo.models.wan import DTYPES, WanTI2V, flow_shift, tile_decoding
        from videogrpo.rewards.terms import training_scorer

        offloading = cfg.train.offload_inference_models
        model = WanTI2V.from_config(paths.model, ctx.device, cfg, offload.HOST if offloading else None)
        tile_decoding(model.vae, cfg.grpo.vae_tile_size)
        (policy,) = model.trainable.values()
        if lora.enabled(cfg):  # the same adapters as the train ranks', so that theirs load by name
            lora.add_adapters(policy, cfg, 0)
        # Frozen and whole, in the compute dtype: what FSDP's mixed-precision policy gathers on a train rank.
        policy.requires_grad_(False).eval().to(DTYPES[cfg.parallel.param_dtype])
        placement = offload.Placement(
            ctx.device,
            offloading,
            {"text_encoder": model.text_encoder, "vae": model.vae},
            {"text_encoder": [model.text_encoder], "vae": [model.vae.encoder, model.vae.decoder]},
        )
        order = training_order(load_split(paths.dataset, "rl"), cfg.data.shuffle_seed)
        shift, _ = flow_shift(cfg, paths.model)
        return cls(
            cfg,
            ctx,
            model,
            policy,
            placement,
            training_scorer(cfg, paths.evalkit, sorted({s.task for s in order})),
            order,
            sigma_schedule(cfg.grpo.sampling_steps, shift),
            shift,
            model.geometry(cfg.video.num_frames, cfg.video.height, cfg.video.width).shape,
        )

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """The train ranks' weights into the frozen policy, by name; every one must be known."""
        params = {travel_name(n): p for n, p in self.policy.named_parameters()}
        unknown = sorted(set(weights) - set(params))
        if unknown:
            raise RuntimeError(f"actor rank {self.ctx.rank}: the train ranks sent weights it has not: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor.to(params[name].dtype))


def run_actor(cfg, paths, ctx) -> None:
    """An actor's life: wait for the train root's next batch (with weights when behind), roll out, decode and score
    its pieces, send each to its train rank; until the train root says stop. A piece is sent once the next one is
    rolled out (its scoring overlaps that rollout), so a train rank waits at most about two pieces' work for each."""
    link = ctx.link
    state = ActorState.build(cfg, paths, ctx)
    dealt = pieces(cfg, link.train_world)
    print(f"[rank {ctx.rank}] rollout actor of {link.train_world} train ranks", file=sys.stderr, flush=True)
    try:
        while True:
            header, weights = link.recv(0, "the next batch from the train root", bounded=False)
            if header["kind"] == "stop":
                return
            if header["weights"]:
                state.load(weights)
            batch = header["batch"]
            _, prompts = batch_for_step(state.order, cfg.grpo.prompts_per_step, batch)
            waiting = None
            for k in header["pieces"]:
                r, w, rows = dealt[k]
                with torch.no_grad():
                    chunk = rollout_batch.rollout_wave(state, batch, prompts, rows)  # submitted for scoring
                if waiting is not None:
                    send_piece(state, batch, header["version"], *waiting)
                waiting = (r, w, rows, chunk)
            if waiting is not None:
                send_piece(state, batch, header["version"], *waiting)
    finally:
        state.scorer.close()


def send_piece(state: ActorState, batch: int, version: int, rank: int, wave: int, rows: list[Row], chunk) -> None:
    """A rolled-out piece to its train rank, once scored: the trajectory, the text embeddings, the rewards."""
    results = state.scorer.collect(chunk.futures)
    trajectory = chunk.trajectory
    tensors = {"latents": trajectory.latents, "log_probs": trajectory.log_probs, "etas": trajectory.etas}
    tensors["embeds"] = chunk.embeds
    if trajectory.means is not None:
        tensors["means"] = trajectory.means
    if chunk.condition is not None:
        tensors["condition"] = chunk.condition
    message = {"batch": batch, "wave": wave, "rows": rows, "results": results, "version": version}
    state.ctx.link.send(rank, message, tensors)


def describe(cfg) -> str:
    """The trainer's line for the actors ("" without)."""
    if not cfg.has_actors:
        return ""
    train, world = cfg.train_world_size, cfg.world_size
    return (
        f"rollout actors: ranks 0..{train - 1} train, ranks {train}..{world - 1} ({world - train}) roll out and "
        f"score, synchronous, weights sent as {weight_sync(cfg)}"
    )
