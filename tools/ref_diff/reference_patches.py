"""Runtime patches that let the reference's DanceGRPOTrainer run as CPU processes over gloo without editing its
tree (this is the tool's own code; the reference is imported from its checkout, never copied).

Every patch the tool applies to the reference:
  P1 `src.trainer.base_rl_trainer.torch` -> a proxy: torch.device('cuda:N') is the CPU, torch.cuda.set_device a
     no-op, torch.cuda.device_count() 1 (its device set-up names CUDA).
  P2 TORCH_DISTRIBUTED_BACKEND=gloo (which the reference honours) and a single-rank env:// rendezvous by
     default (under torchrun its RANK, WORLD_SIZE, ... are kept).
  P3 `src.trainer.base_rl_trainer.init_device_mesh` -> device type 'cuda' mapped to 'cpu', so that its FSDP2 and
     TP meshes are made over gloo; `src.trainer.tensor_parallel.torch` -> a proxy whose torch.cuda.current_device()
     is 0 (its TP RMSNorm places its weight on the mesh's device type with the current CUDA index).
  P4 the configuration (reference_side.make_cfg): fsdp only when asked, no HSDP, no fused AdamW, no gradient
     checkpointing, no dataloader workers, no liger kernel or attention backend, no compile, no W&B, no resume.
  P5 a subclass overrides `_build_dataset` with an in-memory precomputed-latent dataset (the wrapper then loads
     neither VAE nor T5), registers an injected reward, and calls a hook before FSDP sharding.
  P6 the comparison's injections (reference_side): x_T, the per-step noise (NoiseQueue), the rewards, the replayed
     timesteps, the per-prompt eta, and with --fp32 the name torch.bfloat16 inside `src.models.wan_i2v` resolved
     to float32.
"""

from __future__ import annotations

import os
import sys
import types

import torch


def reference_root() -> str:
    return os.environ.get("VBVR_RL_ROOT", os.path.join(os.environ.get("DIFF_WORK", "."), "vbvr-rl"))


def import_reference() -> None:
    """Put the reference checkout first on the import path (its package is `src`)."""
    root = reference_root()
    if not os.path.isdir(os.path.join(root, "src", "trainer")):
        raise SystemExit(f"{root}: not a checkout of the reference (no src/trainer); set VBVR_RL_ROOT")
    if root not in sys.path:
        sys.path.insert(0, root)


class TorchProxy(types.ModuleType):
    """Delegates to torch; overrides selected attributes."""

    def __init__(self, name, overrides):
        super().__init__(name)
        self.__dict__.update(overrides)

    def __getattr__(self, k):
        return getattr(torch, k)


class _CudaProxy(types.ModuleType):
    def __getattr__(self, k):
        return getattr(torch.cuda, k)


def _cpu_device(spec=None, *a, **k):
    if isinstance(spec, str) and spec.startswith("cuda"):
        return torch.device("cpu")
    return torch.device(spec, *a, **k)


def apply_cpu_patches() -> None:
    import_reference()
    os.environ.setdefault("TORCH_DISTRIBUTED_BACKEND", "gloo")
    single = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    for k, v in dict(single, MASTER_PORT=os.environ.get("MASTER_PORT", "29533")).items():
        os.environ.setdefault(k, v)
    import src.trainer.base_rl_trainer as brt

    cuda = _CudaProxy("cuda_proxy")
    cuda.set_device = lambda *a, **k: None
    cuda.device_count = lambda: 1
    brt.torch = TorchProxy("torch_proxy_brt", {"device": _cpu_device, "cuda": cuda})
    mesh = brt.init_device_mesh
    brt.init_device_mesh = lambda device_type, *a, **k: mesh("cpu" if device_type == "cuda" else device_type, *a, **k)
    import src.trainer.tensor_parallel as tp

    tp_cuda = _CudaProxy("cuda_proxy_tp")
    tp_cuda.current_device = lambda: 0
    tp.torch = TorchProxy("torch_proxy_tp", {"cuda": tp_cuda})


class NoiseQueue:
    """Inside `src.models.wan_i2v`, torch.randn/randn_like pop the injected tensors (and `overrides` replace other
    torch names there, e.g. bfloat16 -> float32)."""

    def __init__(self, overrides: dict | None = None):
        self.overrides = dict(overrides or {})
        self.items: list[torch.Tensor] = []
        import src.models.wan_i2v as wm

        self._wm = wm
        self._orig = wm.torch

    def push(self, *tensors):
        self.items.extend(tensors)

    def _pop(self, *shape_args, **kw):
        if not self.items:
            raise RuntimeError("NoiseQueue empty: the reference drew more noise than was injected")
        t = self.items.pop(0)
        dtype = kw.get("dtype")
        return t.clone() if dtype is None else t.to(dtype).clone()

    def __enter__(self):
        self._wm.torch = TorchProxy("torch_proxy_wan", {"randn": self._pop, "randn_like": self._pop, **self.overrides})
        return self

    def __exit__(self, *exc):
        self._wm.torch = self._orig
