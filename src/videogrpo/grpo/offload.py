"""Where the frozen models and the rollouts live during a training step (docs/reference-system.md#memory), and how a
wave is cut into rollout chunks.

With `train.offload_inference_models` the text encoder and the VAE sit on CPU except while they work:
both come to the compute device to encode a wave's prompts and first frames, the text encoder leaves
right after, the VAE stays on a rank that decodes its own rollouts for scoring (every rank here: only
tensor-parallel peers other than tp_rank 0 would not) and comes back for decoding wherever it left;
once rewards and advantages are in, both go to CPU and the allocator cache is emptied before replay and
the optimizer step. Each rollout chunk's trajectory goes to CPU as soon as it is recorded, and each
replayed transition comes back alone (two latent states, not the whole trajectory).

`plan` is the one table of that schedule, per phase; `Placement` carries it out and keeps the
books: it records where it put each module, moves modules only with `module.to(device)`, and a forward
pre-hook on each frozen part fails when that part runs while the books say it is not on the compute
device. On CPU both devices are `cpu`, so the books, not the tensors, are what the tests check; on CUDA a
forgotten move would also fail in the forward itself. Without offload every phase keeps everything on the
compute device and no move happens, so results are the same bytes either way.

Rollout chunks (`rollout_chunks`) take `grpo.sample_batch_size` group members of each of the wave's
prompts per forward. Noise is keyed per (batch, prompt, member, step), so a chunk draws what the whole
wave would; the wave is reassembled in its own row order for replay and decoding, so replay's batches,
and with them the gradients, do not depend on the chunk size.
"""

from __future__ import annotations

import torch
from torch import nn

from videogrpo.grpo.rollout import Trajectory

HOST = torch.device("cpu")
PHASES = ("load", "encode", "rollout", "decode", "replay")
FROZEN = ("text_encoder", "vae")


def plan(phase: str, offload: bool, decodes: bool = True) -> dict[str, str]:
    """Where each frozen model is during `phase`: `compute` or `host`.

    `decodes`: this rank decodes its rollouts for scoring, so its VAE stays on the compute device from
    encoding to decoding.
    """
    if not offload:
        return dict.fromkeys(FROZEN, "compute")
    return {
        "load": {"text_encoder": "host", "vae": "host"},
        "encode": {"text_encoder": "compute", "vae": "compute"},
        "rollout": {"text_encoder": "host", "vae": "compute" if decodes else "host"},
        "decode": {"text_encoder": "host", "vae": "compute"},
        "replay": {"text_encoder": "host", "vae": "host"},
    }[phase]


def empty_cache(device: torch.device) -> None:
    """Return the caching allocator's free blocks to the device (what replay's activations then reuse)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


class OffloadError(RuntimeError):
    pass


class Placement:
    """The offload schedule of one rank: the books of where each frozen module is, the moves, the checks."""

    def __init__(
        self,
        compute: torch.device,
        offload: bool,
        modules: dict[str, nn.Module],
        hooked: dict[str, list[nn.Module]],
        decodes: bool = True,
    ):
        """`modules`: the frozen models by name (FROZEN); `hooked`: per name, the sub-modules whose forward
        needs it on the compute device (the VAE's encoder and decoder)."""
        self.compute, self.offload, self.decodes = compute, offload, decodes
        self.modules = modules
        self.phase = "load"
        self.where = plan("load", offload, decodes)
        """Per frozen model, `compute` or `host`: the books, which stay apart where both devices are one (CPU)."""
        self.moves: list[tuple[str, str, str]] = []
        """(phase, what, `compute` or `host`) of every move: a frozen model, a parked trajectory, a fetched transition,
        and each emptying of the allocator cache."""
        for name, parts in hooked.items():
            for part in parts:
                part.register_forward_pre_hook(self._check(name))

    def device(self, kind: str) -> torch.device:
        return self.compute if kind == "compute" else HOST

    def _check(self, name: str):
        def hook(module, args):
            if self.where[name] != "compute":
                raise OffloadError(
                    f"the {name} runs in phase {self.phase!r} while the offload schedule has it on the host, not on "
                    f"the compute device {self.compute} (grpo/offload.py: plan)"
                )

        return hook

    def enter(self, phase: str) -> None:
        """Move every frozen model to where `plan` says it is during `phase`; entering replay also empties
        the allocator cache."""
        self.phase = phase
        for name, kind in plan(phase, self.offload, self.decodes).items():
            if self.where[name] != kind:
                self.modules[name].to(self.device(kind))
                self.where[name] = kind
                self.moves.append((phase, name, kind))
        if phase == "replay" and self.offload:
            empty_cache(self.compute)
            self.moves.append((phase, "allocator cache emptied", "compute"))

    def park(self, trajectory: Trajectory) -> Trajectory:
        """A rollout chunk's record, on CPU when offloading (else as it is)."""
        if not self.offload:
            return trajectory
        self.moves.append((self.phase, "trajectory", "host"))
        means = None if trajectory.means is None else trajectory.means.to(HOST)
        return Trajectory(trajectory.latents.to(HOST), trajectory.log_probs.to(HOST), trajectory.etas.to(HOST), means)

    def park_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(HOST) if self.offload else tensor

    def transition(self, trajectory: Trajectory, index: int, rows: list[int]) -> Trajectory:
        """States `index` and `index + 1` of the trajectory's `rows` (parked or not) with their log-prob, on the
        compute device: all that replaying transition `index` of one replay chunk reads
        (`rollout.replay_log_prob` at index 0)."""
        if self.offload:
            self.moves.append((self.phase, "transition", "compute"))
        means = trajectory.means
        return Trajectory(
            trajectory.latents[:, index : index + 2][rows].to(self.compute),
            trajectory.log_probs[:, index : index + 1][rows].to(self.compute),
            trajectory.etas[rows].to(self.compute),
            None if means is None else means[:, index : index + 1][rows].to(self.compute),
        )

    def final(self, trajectory: Trajectory, rows: list[int]) -> torch.Tensor:
        """The clean latents (the last state) of the trajectory's `rows`, on the compute device: all that DiffusionNFT
        reads of a rollout."""
        if self.offload:
            self.moves.append((self.phase, "final latents", "compute"))
        return trajectory.latents[:, -1][rows].to(self.compute)


def decode_in_batches(decode, latents: torch.Tensor, batch_size: int | None) -> list:
    """`decode(latents[i : i + batch_size])` over the rows, one video per row (None or 0: one call for all)."""
    step = batch_size or len(latents)
    return [video for i in range(0, len(latents), step) for video in decode(latents[i : i + step])]


def rollout_chunks(rows: list[tuple[int, int]], members_per_chunk: int | None) -> list[list[int]]:
    """Positions in `rows` ((prompt, member) of one wave) of each rollout chunk: `members_per_chunk` members of
    every prompt of the wave at a time, in the wave's order (None: one chunk of the whole wave)."""
    members = list(dict.fromkeys(g for _, g in rows))
    step = members_per_chunk or len(members)
    chunks = []
    for start in range(0, len(members), step):
        take = set(members[start : start + step])
        chunks.append([i for i, (_, g) in enumerate(rows) if g in take])
    return chunks


def assemble(parts: list[Trajectory], positions: list[list[int]]) -> Trajectory:
    """One trajectory of the wave in its own row order from the chunks' (rows at `positions`)."""
    order = torch.tensor([i for chunk in positions for i in chunk])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    if len(parts) == 1 and torch.equal(order, torch.arange(len(order))):
        return parts[0]
    means = None if parts[0].means is None else torch.cat([p.means for p in parts])[inverse]
    return Trajectory(
        torch.cat([p.latents for p in parts])[inverse],
        torch.cat([p.log_probs for p in parts])[inverse],
        torch.cat([p.etas for p in parts])[inverse],
        means,
    )
