"""The link between the train ranks and the rollout actors (the `actors` section, docs/options.md#rollout-actors).

With actors, the train ranks form the job's default process group on their own (world: the train ranks), so that
every collective of training (FSDP, the reductions of metrics and rewards) is the one a job of that many ranks would
run, and nothing of training waits on an actor. Every rank of the job, train ranks and actors, also joins one gloo
group, the link, over the same rendezvous store: messages between a train rank and an actor go over it, point to
point, on host memory. A message is a header (any picklable object, with the dtype and shape of each tensor) and the
tensors' bytes, each one send: bf16 and every other dtype travel as bytes.

A train rank's receive of an actor's rollouts waits at most actors.stall_timeout_s; past it the run stops with an
error that names the peer by its rank and node, instead of waiting forever on an actor that died or stalled. An
actor's wait for its next batch is bounded by the process groups' timeout only (the train ranks may be updating,
validating or writing a checkpoint meanwhile).

May import the core modules.
"""

from __future__ import annotations

import datetime
import pickle
import socket
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from videogrpo.errors import VideoGRPOError

LINK_PREFIX = "videogrpo-actors-link"
TRAIN_PREFIX = "videogrpo-train"


class LinkError(VideoGRPOError):
    """A peer on the link sent nothing within the stall timeout, or its message could not be read."""


@dataclass
class Posted:
    """A message on its way: the sends' handles and the bytes they read."""

    works: list
    parts: list[torch.Tensor]

    def wait(self) -> None:
        for work in self.works:
            work.wait()


@dataclass
class Outbox:
    """Posted messages, oldest first, kept until known received. (A gloo send does not say it is complete until
    waited for: a sender that knows its receiver has taken a message waits for it, at once, to free its bytes.)"""

    posted: list[Posted] = field(default_factory=list)

    def add(self, message: Posted) -> None:
        self.posted.append(message)

    def settle(self, keep: int = 0) -> None:
        """Wait for all but the newest `keep` messages."""
        while len(self.posted) > keep:
            self.posted.pop(0).wait()


@dataclass
class Link:
    group: object
    """The gloo process group over every rank of the job."""
    rank: int
    """This process's rank in the job (the link's rank)."""
    world: int
    """Ranks of the job: train ranks and actors."""
    timeout_s: float
    train_world: int = 0
    """The train ranks (0 .. train_world - 1); the others are actors."""
    nodes: dict[int, str] = field(default_factory=dict)
    """Each peer's node, as it said in its hello (names it in errors)."""

    def send(self, dst: int, header, tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Send `header` (picklable) and `tensors` (any device, any dtype) to rank `dst`, and wait until sent."""
        self.post(dst, header, tensors).wait()

    def post(self, dst: int, header, tensors: dict[str, torch.Tensor] | None = None) -> Posted:
        """Start sending `header` and `tensors` to rank `dst` without waiting for the receiver: messages to one rank
        arrive in the order they were posted. The returned Posted holds the bytes until it is complete."""
        tensors = tensors or {}
        layout = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors.items()]
        meta = torch.frombuffer(bytearray(pickle.dumps((header, layout))), dtype=torch.uint8)
        parts = [torch.tensor([meta.numel()], dtype=torch.int64), meta]
        parts += [t.detach().contiguous().cpu().view(-1).view(torch.uint8) for t in tensors.values() if t.numel()]
        return Posted([self.group.send([part], dst, 0) for part in parts], parts)

    def recv(self, src: int, what: str, bounded: bool = True) -> tuple[object, dict[str, torch.Tensor]]:
        """(header, tensors) of the next message from rank `src`; `what` says what is awaited (for the error).
        `bounded`: its first part within the stall timeout (else within the process groups' timeout: an actor
        waiting for its next batch while the train ranks update, validate or checkpoint)."""
        size = torch.zeros(1, dtype=torch.int64)
        self._recv(size, src, what, bounded)
        meta = torch.empty(int(size), dtype=torch.uint8)
        self._recv(meta, src, what)
        header, layout = pickle.loads(meta.numpy().tobytes())
        tensors = {}
        for name, dtype, shape in layout:
            kind = getattr(torch, dtype)
            out = torch.empty(shape, dtype=kind)
            if out.numel():
                self._recv(out.view(-1).view(torch.uint8), src, what)
            tensors[name] = out
        return header, tensors

    def _recv(self, tensor: torch.Tensor, src: int, what: str, bounded: bool = True) -> None:
        work = self.group.recv([tensor], src, 0)
        try:
            work.wait(datetime.timedelta(seconds=self.timeout_s)) if bounded else work.wait()
        except RuntimeError as err:
            node = self.nodes.get(src, "an unknown node")
            within = f"actors.stall_timeout_s = {self.timeout_s:g} s" if bounded else "the process groups' timeout"
            raise LinkError(
                f"rank {self.rank}: nothing from rank {src} (on {node}) while waiting for {what} within {within}: "
                f"that rank died or stalled ({err}). Complete checkpoints are kept: a plain rerun resumes from the "
                "last one"
            ) from None

    def hello(self, peers: list[int]) -> None:
        """Tell `peers` this rank's node and learn theirs (every rank of the link calls it with its peers)."""
        mine = socket.gethostname()
        for peer in sorted(peers):
            if peer < self.rank:  # the lower rank speaks first: no two ranks wait on each other
                self.nodes[peer] = self.recv(peer, "a hello", bounded=False)[0]
                self.send(peer, mine)
            else:
                self.send(peer, mine)
                self.nodes[peer] = self.recv(peer, "a hello", bounded=False)[0]


def connect(
    rank: int, world: int, train_world: int, backend: str, timeout_s: float, device_id, group_timeout_s: float
) -> Link:
    """Join the job's rendezvous store (torchrun's MASTER_ADDR and MASTER_PORT): a train rank (`rank` <
    `train_world`) makes the default process group of the train ranks; every rank joins the link (`timeout_s`: the
    stall timeout of a bounded receive; `group_timeout_s`: every other wait's)."""
    import os

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=group_timeout_s),
    )
    if rank < train_world and not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(TRAIN_PREFIX, store),
            rank=rank,
            world_size=train_world,
            device_id=device_id,
            timeout=datetime.timedelta(seconds=group_timeout_s),
        )
    group = dist.ProcessGroupGloo(
        dist.PrefixStore(LINK_PREFIX, store), rank, world, datetime.timedelta(seconds=group_timeout_s)
    )
    link = Link(group, rank, world, timeout_s, train_world)
    link.hello(list(range(train_world, world)) if rank < train_world else list(range(train_world)))
    return link
