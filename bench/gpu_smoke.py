"""GPU smoke benchmark: does the CUDA path start, fit and how fast does it run, on one GPU.

    bash bench/gpu_smoke.sh                       # on a GPU node, in the GPU environment (make gpu-env)
    python bench/gpu_smoke.py --cpu               # the same code path on CPU with small shapes (a test runs it)

Every part prints one table; nothing is asserted about speed. Parts:
1. the node: torch, CUDA, device, driver, compute capability, NCCL, the peak bf16 FLOP/s used for MFU;
2. attention backends: each diffusers backend on a Wan-shaped attention (bf16, 24 heads x 128): runs or
   why not, largest difference from `native`, milliseconds per call;
3. torch.compile on the transformer blocks (`fsdp.compile_blocks`): the compiled and eager
   velocity agree, time per forward of each;
4. GRPO updates through the real trainer (`videogrpo.grpo.worker` under torchrun, one process, FSDP2 with
   bf16 compute and float32 master weights, one-step-delayed replay, the rule reward through the
   reference EvalKit's scorer processes): a mid-size transformer, then the TI2V-5B transformer's real
   shape with random weights at 81 x 512 x 512 (skipped with --no-5b). Per run: seconds per update,
   tokens/s and MFU of the trainer's own metrics, and the peak memory the trainer measured in each phase
   (rollout, replay; CUDA's allocated peak reset per phase) and over the update, each beside what preflight's
   memory plan gives the same run.
The frozen models are small stand-ins (a 2-layer UMT5 of the 5B's width, the tiny VAE with the real
latent layout): part 4 measures the transformer's training, not text encoding or video decoding.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from videogrpo.demo.smoke_run import one_process_config, shaped_pipeline, synthetic_inputs, train_one_process
from videogrpo.models.shapes import MID_TI2V, TINY_TI2V_5B_LAYOUT, WAN_TI2V_5B

REPO = Path(__file__).resolve().parents[1]

# name: (transformer, text width, frames, height, width, group size, sampling steps, updates)
RUNS = {
    "mid": (MID_TI2V, 1024, 33, 256, 256, 4, 8, 4),
    "5b": (WAN_TI2V_5B, 4096, 81, 512, 512, 2, 6, 2),
}
CPU_RUNS = {"cpu-small": (TINY_TI2V_5B_LAYOUT, 32, 9, 64, 64, 2, 3, 2)}


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    sys.stdout.flush()


def node_facts(device: torch.device) -> None:
    from videogrpo.grpo.flops import device_peak_flops

    rows = [["torch", torch.__version__], ["torch CUDA build", torch.version.cuda or "-"]]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        rows += [
            ["device", f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.1f} GiB"],
            ["compute capability", f"{props.major}.{props.minor}"],
            ["NCCL", ".".join(map(str, torch.cuda.nccl.version()))],
            ["peak bf16 (MFU's denominator)", f"{(device_peak_flops(device) or 0) / 1e12:.0f} TFLOP/s"],
        ]
        try:
            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        except OSError:
            driver = "nvidia-smi not found"
        rows.append(["driver", driver])
    print_table("Node", ["what", "found"], rows)


def attention_backends(device: torch.device, dtype: torch.dtype) -> None:
    """Every backend diffusers knows, on one attention of the 5B's head layout."""
    from diffusers.models.attention_dispatch import AttentionBackendName, attention_backend, dispatch_attention_fn

    tokens = 4096 if device.type == "cuda" else 64
    heads, dim = (24, 128) if device.type == "cuda" else (2, 24)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, dim, device=device, dtype=dtype, generator=gen) for _ in range(3))

    def call(name: str) -> torch.Tensor:
        with attention_backend(name):
            return dispatch_attention_fn(q, k, v)

    reference = call("native").float()
    rows = []
    for backend in sorted(b.value for b in AttentionBackendName):
        try:
            out = call(backend)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                out = call(backend)
            if device.type == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 100
            diff = (out.float() - reference).abs().max().item()
            rows.append([backend, "runs", f"{diff:.2e}", f"{ms:.3f}"])
        except Exception as err:  # the finding is which backends run here, and why the others do not
            rows.append([backend, f"no: {type(err).__name__}: {str(err).splitlines()[0][:90]}", "-", "-"])
    print_table(
        f"Attention backends ({tokens} tokens, {heads} heads x {dim}, {str(dtype).removeprefix('torch.')})",
        ["backend", "status", "max |diff| vs native", "ms per call"],
        rows,
    )


def compiled_blocks(device: torch.device, dtype: torch.dtype, transformer_cfg: dict) -> None:
    """Eager against compiled blocks on one forward (inductor), on the mid-size shape."""
    from diffusers import WanTransformer3DModel

    from videogrpo.parallel import fsdp

    torch.manual_seed(0)
    model = WanTransformer3DModel(**transformer_cfg).to(device, dtype).eval()
    frames, size = (9, 16) if device.type == "cuda" else (2, 8)
    x = torch.randn(1, 48, frames, size, size, device=device, dtype=dtype)
    t = torch.full((1,), 500.0, device=device)
    text = torch.randn(1, 64, transformer_cfg["text_dim"], device=device, dtype=dtype)

    def forward() -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
            if device.type == "cuda":
                torch.cuda.synchronize()
            return out.float(), time.perf_counter() - start

    eager, t_eager = forward()
    start = time.perf_counter()
    fsdp.compile_blocks(model)
    compiled, t_compiled = forward()
    compile_s = time.perf_counter() - start
    diff = (compiled - eager).abs().max().item() / max(eager.abs().max().item(), 1e-12)
    print_table(
        "torch.compile on the blocks",
        ["shape", "eager s/forward", "compiled s/forward", "first compiled call s", "max |diff| / max |eager|"],
        [[f"{transformer_cfg['num_layers']} blocks, {frames}x{size}x{size} latent", f"{t_eager:.4f}",
          f"{t_compiled:.4f}", f"{compile_s:.1f}", f"{diff:.2e}"]],
    )  # fmt: skip


def planned_phases(cfg: dict, model: Path) -> dict[str, float]:
    """GiB per phase (rollout, replay) and at the peak that preflight's memory plan gives this run, compared with what
    the trainer measured (peak_memory_<phase>_bytes: CUDA's allocated peak, reset per phase)."""
    from videogrpo.config import from_dict
    from videogrpo.preflight import memory_plan, model_shape

    plan = memory_plan.plan_for_config(from_dict(cfg), model_shape.ModelShape.from_model_dir(model))
    phases = {phase: plan.phase_total(phase) / 2**30 for phase in (memory_plan.ROLLOUT, memory_plan.REPLAY)}
    return {**phases, "peak": plan.peak / 2**30}


def training_runs(root: Path, runs: dict, cuda: bool) -> None:
    """Each run's table printed as soon as it ends: a run cut off by a time limit keeps the ones before it."""
    dataset, kit = synthetic_inputs(root)
    defaults = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for name, (transformer_cfg, text_width, frames, height, width, group, steps, updates) in runs.items():
        start = time.monotonic()
        model = shaped_pipeline(root / name, transformer_cfg, text_width)
        print(f"{name}: model built in {time.monotonic() - start:.0f} s", flush=True)
        cfg = one_process_config(defaults, kit, frames, height, width, group, steps, updates, cuda)
        planned = planned_phases(cfg, model)
        metrics = train_one_process(root, name, cfg, model, dataset)
        shutil.rmtree(root / name / "model", ignore_errors=True)
        blocks, heads = transformer_cfg["num_layers"], transformer_cfg["num_attention_heads"]
        shape = f"{blocks} blocks x {heads} heads, {frames}x{height}x{width}, G={group}, T={steps}"
        failed = [name, shape, "failed (log above)", "-", "-", "-", "-"]
        rows = [failed + [f"- / {planned[p]:.2f}" for p in ("rollout", "replay", "peak")]] if not metrics else []
        for m in metrics:
            mfu = f"{m['time_mfu']:.3f}" if m.get("time_mfu") is not None else "-"
            rows.append(
                [
                    name,
                    shape,
                    m["step"],
                    f"{m['time_step_s']:.2f}",
                    f"{m['time_rollout_s']:.2f} / {m['time_replay_s']:.2f}",
                    f"{m['time_tokens_per_s']:.0f}" if m.get("time_tokens_per_s") else "-",
                    mfu,
                    *(
                        f"{m.get(f'peak_memory_{key}bytes', 0) / 2**30:.2f} / {planned[phase]:.2f}"
                        for key, phase in (("rollout_", "rollout"), ("replay_", "replay"), ("", "peak"))
                    ),
                ]
            )
        print_table(
            f"GRPO updates through the trainer: {name} (1 process, FSDP2, delayed replay; update 1 includes "
            "compilation)",
            ["run", "shape", "update", "s/update", "rollout / replay s", "tokens/s", "MFU"]
            + [f"{what} GiB measured / planned" for what in ("rollout", "replay", "peak")],
            rows,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run every part on CPU with small shapes")
    parser.add_argument("--no-5b", action="store_true", help="skip the 5B-shaped training run")
    args = parser.parse_args()
    cuda = not args.cpu
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible: run on a GPU node, or pass --cpu for the CPU check")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    total = time.monotonic()
    node_facts(device)
    attention_backends(device, dtype)
    compiled_blocks(device, dtype, MID_TI2V if cuda else TINY_TI2V_5B_LAYOUT)
    runs = dict(RUNS) if cuda else dict(CPU_RUNS)
    if args.no_5b:
        runs.pop("5b", None)
    root = Path(tempfile.mkdtemp(prefix="videogrpo-gpu-smoke-"))
    try:
        training_runs(root, runs, cuda)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\ngpu smoke: {time.monotonic() - total:.0f} s in all")


if __name__ == "__main__":
    main()
