"""AdamW stepped in host memory (parallel.offload_optimizer), with the gradients waiting there for it
(parallel.offload_gradients): the same update, with the optimizer state off the device.

`HostAdamW` is a torch AdamW over the device parameters (so checkpoints see the optimizer torch's would be: the
same param groups, the same state keys, under FSDP2 the same DTensor shards) whose state lives on the host. For
each trainable parameter it keeps, in host memory (pinned on CUDA, so the copies can overlap), a float32 copy of
the master weight's local shard (`to_local()` of a DTensor under FSDP2, HSDP or TP x FSDP; the whole tensor
under `replicate`), a gradient buffer, and AdamW's two moments. A step copies each gradient's local shard to its
host buffer, steps a torch AdamW over the host copies (torch's own arithmetic, as the on-device optimizer's),
and copies each updated master shard back into the device parameter. The optimizer's `state` shows the host
moments as the device optimizer's would be (a DTensor over the host shard under FSDP2), so DCP saves and loads
them in place, and a checkpoint written with offload off resumes with it on and the other way round.

The host master copy is refreshed from the device whenever the device parameter was written by anyone else
(a checkpoint load, weights from train.resume_from): torch counts every in-place write to a tensor (`_version`),
and a step records the counts its own copy back left (`_written`).

With `offload_gradients`, `park_gradients` (called after the clipping norm, on the clipped gradients) moves every
gradient to its host buffer and drops the device's, so the device holds no gradient during the host step.
Gradients still accumulate on the device during the backward passes: the reduction (FSDP's reduce-scatter, the
replicated layout's all-reduce) and the clipping norm run there as without offload.

On CPU the device and the host are one, so where a tensor is cannot be read off it: the books (`host_tensors`,
the storages this optimizer allocated on the host; `moves`, every copy by what and where to) say where each is
meant to live, and `misplaced` checks the optimizer's state and the parameters' gradients against them.
"""

from __future__ import annotations

import torch

HOST = torch.device("cpu")


class HostOffloadError(RuntimeError):
    pass


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2, HSDP, TP x FSDP), else the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _written(param: torch.Tensor) -> tuple[int, int, int]:
    """What changes when anyone writes a device parameter: torch's write counts of the parameter (a load through
    the DTensor counts there, not in its local tensor) and of its local tensor (this optimizer's copies back), and
    the local tensor's storage (FSDP2 may re-pad a loaded shard into a new one)."""
    local = _local(param)
    return param._version, local._version, local.data_ptr()


def _like_param(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (a host tensor shaped like the parameter's local shard) as the parameter's kind of tensor: a DTensor
    over the same mesh and placements for a DTensor parameter (no copy), else `local` itself."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def optimizer(params: list[torch.nn.Parameter], lr: float, weight_decay: float, parallel) -> torch.optim.Optimizer:
    """The AdamW of one trainable transformer: torch's on the device, or `HostAdamW` (parallel.offload_optimizer)."""
    if not parallel.offload_optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return HostAdamW(params, lr=lr, weight_decay=weight_decay, offload_gradients=parallel.offload_gradients)


class HostAdamW(torch.optim.AdamW):
    def __init__(self, params, lr: float, weight_decay: float, offload_gradients: bool):
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.offload_gradients = offload_gradients
        device_params = [p for group in self.param_groups for p in group["params"]]
        self.pin = any(p.device.type == "cuda" for p in device_params) and torch.cuda.is_available()
        self.host_tensors: dict[int, str] = {}
        """The books: data pointer -> role (`master`, `gradient`, `exp_avg`, `exp_avg_sq`) of every host tensor."""
        self.moves: list[tuple[str, str]] = []
        """(what, `host` or `device`) of every copy: `gradients` to the host, `weights` back to the device, a
        `master refresh` from the device."""
        self.masters = [self._allocate(_local(p), "master") for p in device_params]
        self.host_grads = [self._allocate(_local(p), "gradient") for p in device_params]
        self.written: list[tuple | None] = [None] * len(device_params)
        """What each device parameter looked like after this optimizer's own last write (`_written`; None: refresh
        the host copy before stepping)."""
        self.parked = [False] * len(device_params)
        self.params_in_order = device_params
        # The host AdamW: torch's own, over the host master copies, with the device optimizer's hyperparameters.
        self.host = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay)

    def _allocate(self, like: torch.Tensor, role: str) -> torch.Tensor:
        if like.device.type == "meta":  # a simulated rank (videogrpo simulate): shapes only, nothing allocated
            return torch.empty(like.shape, dtype=like.dtype, device="meta")
        tensor = torch.zeros(like.shape, dtype=like.dtype, device=HOST, pin_memory=self.pin)
        if tensor.numel():  # an empty shard (FSDP's last ranks of a 1-row parameter) holds no memory anywhere
            self.host_tensors[tensor.data_ptr()] = role
        return tensor

    @torch.no_grad()
    def park_gradients(self) -> None:
        """With offload_gradients: every gradient to its host buffer, the device's dropped (after clipping)."""
        if not self.offload_gradients:
            return
        for i, param in enumerate(self.params_in_order):
            if param.grad is not None:
                self.host_grads[i].copy_(_local(param.grad), non_blocking=self.pin)
                param.grad = None
                self.parked[i] = True
        self.moves.append(("gradients", "host"))

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("HostAdamW.step takes no closure")
        for host_group, group in zip(self.host.param_groups, self.param_groups, strict=True):
            host_group.update({k: v for k, v in group.items() if k != "params"})
        stepped = []
        for i, param in enumerate(self.params_in_order):
            local = _local(param)
            if _written(param) != self.written[i]:  # written by someone else since our last copy back
                self.masters[i].copy_(local, non_blocking=self.pin)
                self.moves.append(("master refresh", "host"))
            if not self.parked[i] and param.grad is not None:
                self.host_grads[i].copy_(_local(param.grad), non_blocking=self.pin)
                self.parked[i] = True
            # No gradient (an expert that served no replayed step): torch's AdamW skips the parameter.
            self.masters[i].grad = self.host_grads[i] if self.parked[i] else None
            if self.parked[i]:
                stepped.append(i)
                self._host_state(i)
        if stepped:
            self.moves.append(("gradients", "host"))
        if self.pin:
            torch.cuda.synchronize()  # the non-blocking copies to the host have landed
        self.host.step()
        for i in stepped:
            local = _local(self.params_in_order[i])
            local.copy_(self.masters[i], non_blocking=self.pin)
            self.written[i] = _written(self.params_in_order[i])
            self.masters[i].grad = None
            self.parked[i] = False
        if stepped:
            self.moves.append(("weights", "device"))
        return None

    def _host_state(self, i: int) -> None:
        """AdamW's state of parameter i, made as torch's AdamW makes it at its first step but in host memory, and
        shown in `self.state` as the device optimizer's would be."""
        master, param = self.masters[i], self.params_in_order[i]
        if not self.host.state[master]:
            self.host.state[master] = {
                "step": torch.tensor(0.0, dtype=torch.get_default_dtype()),
                "exp_avg": self._allocate(master, "exp_avg"),
                "exp_avg_sq": self._allocate(master, "exp_avg_sq"),
            }
        if not self.state[param]:
            host = self.host.state[master]
            self.state[param] = {
                "step": host["step"],
                "exp_avg": _like_param(param, host["exp_avg"]),
                "exp_avg_sq": _like_param(param, host["exp_avg_sq"]),
            }

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.parked = [False] * len(self.parked)

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Copy a saved AdamW state (this optimizer's or a device AdamW's) into the host state; DCP has usually
        loaded it in place already (its tensors are the host ones), then nothing is copied. torch's own
        load_state_dict would move every moment to the parameter's device."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the saved optimizer has {len(saved_groups)} param groups, this one {len(self.param_groups)}"
            )
        index = {id(p): i for i, p in enumerate(self.params_in_order)}
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("the saved optimizer's param group differs in length from this one's")
            for key, param in zip(saved["params"], group["params"], strict=True):
                if key not in state_dict["state"]:
                    continue
                i = index[id(param)]
                self._host_state(i)
                mine = self.host.state[self.masters[i]]
                for name, value in state_dict["state"][key].items():
                    source = _local(value)
                    if source.data_ptr() != mine[name].data_ptr():
                        mine[name].copy_(source)
        for host_group, group in zip(self.host.param_groups, self.param_groups, strict=True):
            host_group.update({k: v for k, v in group.items() if k != "params"})

    def misplaced(self) -> list[str]:
        """What is not where the books say it lives: AdamW state outside this optimizer's host tensors, a device
        gradient while gradients are parked (offload_gradients). Empty: all in place."""
        found = []
        for i, param in enumerate(self.params_in_order):
            for name, value in self.state.get(param, {}).items():
                if name != "step" and _local(value).numel() and self.host_tensors.get(_local(value).data_ptr()) != name:
                    found.append(f"parameter {i}: AdamW {name} is not in host memory")
            if self.offload_gradients and self.parked[i] and param.grad is not None:
                found.append(f"parameter {i}: a gradient on the device while it is parked on the host")
        return found
