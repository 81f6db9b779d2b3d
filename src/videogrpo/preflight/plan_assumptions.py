"""What `videogrpo plan`'s time model takes as given (`Assumptions`: each printed and each an option) and the GPUs it
knows by name. Torch-free, so that building the CLI's parser imports no torch (a light stage never does).

May import: `grpo.flops` (when a plan is made) and the core modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from videogrpo.errors import ConfigError

GPU_MEMORY_GIB = {"h100": 80, "h200": 141, "h800": 80, "a100": 80, "a800": 80, "b200": 180, "l40s": 48}
"""The default memory of each GPU name `--gpu` takes (its largest common variant); `--gpu-memory` overrides it."""


@dataclass(frozen=True)
class Assumptions:
    """What the time model takes as given; `videogrpo plan` prints each and takes each as an option."""

    gpu: str = "h100"
    """The GPU's name as CUDA reports it (its dense bf16 peak: grpo.flops.PEAK_BF16)."""
    mfu: float = 0.30
    """Share of the peak the transformer's matmuls reach."""
    video_overhead_s: float = 4.4
    """Seconds per rolled-out video on a scoring rank: decoding, encoding for the reward and scoring."""
    nvlink_gbps: float = 200.0
    """Collective bandwidth inside a node, GB/s per GPU (NCCL bus bandwidth)."""
    network_gbps: float = 25.0
    """Collective bandwidth across nodes, GB/s per GPU (a 200 Gb/s NIC per GPU)."""
    pcie_gbps: float = 20.0
    """Host-device copy bandwidth, GB/s per GPU."""
    headroom: float = 0.0
    """Share of each GPU a layout must leave free to count as fitting (the plan's error, fragmentation)."""

    @property
    def peak_flops(self) -> float:
        from videogrpo.grpo.flops import peak_bf16_flops  # torch: imported only when a plan is made

        peak = peak_bf16_flops(self.gpu.upper())
        if peak is None:
            known = ", ".join(sorted(GPU_MEMORY_GIB))
            raise ConfigError(f"--gpu {self.gpu}: its bf16 peak is not known here; give one of {known}")
        return peak

    def lines(self) -> list[str]:
        return [
            f"GPU {self.gpu}: dense bf16 peak {self.peak_flops / 1e12:,.0f} TFLOP/s at MFU {self.mfu:g} (--mfu)",
            f"per video on a scoring rank: {self.video_overhead_s:g} s decode, encode and reward (--video-overhead-s)",
            f"collectives not overlapped with compute: NVLink {self.nvlink_gbps:g} GB/s (--nvlink-gbps), "
            f"network {self.network_gbps:g} GB/s (--network-gbps) per GPU; PCIe {self.pcie_gbps:g} GB/s (--pcie-gbps)",
            *([f"a layout fits with {self.headroom:.0%} of each GPU left free (--headroom)"] if self.headroom else []),
        ]


TUNABLE = ("mfu", "video_overhead_s", "nvlink_gbps", "network_gbps", "pcie_gbps", "headroom")
"""The assumptions `videogrpo plan` takes as options (--mfu, ...): every field of Assumptions but `gpu`."""
