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
   tokens/s and MFU of the trainer's own metrics, the peak memory the trainer recorded, and the peak
   preflight's memory plan gives the same run.
The frozen models are small stand-ins (a 2-layer UMT5 of the 5B's width, the tiny VAE with the real
latent layout): part 4 measures the transformer's training, not text encoding or video decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]

# Wan2.2-TI2V-5B-Diffusers transformer/config.json (the fields that set shapes).
WAN_5B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=24,
    attention_head_dim=128,
    in_channels=48,
    out_channels=48,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=14336,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=1024,
)
MID = dict(WAN_5B, num_attention_heads=12, ffn_dim=4096, num_layers=8, text_dim=1024)
CPU_SMALL = dict(WAN_5B, num_attention_heads=2, attention_head_dim=24, ffn_dim=96, num_layers=2, text_dim=32)

# name: (transformer, text width, frames, height, width, group size, sampling steps, updates)
RUNS = {
    "mid": (MID, 1024, 33, 256, 256, 4, 8, 4),
    "5b": (WAN_5B, 4096, 81, 512, 512, 2, 6, 2),
}
CPU_RUNS = {"cpu-small": (CPU_SMALL, 32, 9, 64, 64, 2, 3, 2)}


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


def build_model(root: Path, transformer_cfg: dict, text_width: int) -> Path:
    """The tiny pipeline with the transformer (random weights) and text encoder width of `transformer_cfg`."""
    from diffusers import WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from videogrpo.demo.tiny_ti2v import TEXT_ENCODER, save_tiny_pipeline

    model = root / "model"
    save_tiny_pipeline(model, seed=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # initialising 5B parameters on the CPU alone takes minutes
        torch.manual_seed(0)
        transformer = WanTransformer3DModel(**transformer_cfg).to(torch.bfloat16)
    shutil.rmtree(model / "transformer")
    transformer.save_pretrained(str(model / "transformer"))
    del transformer
    vocab = json.loads((model / "text_encoder/config.json").read_text())["vocab_size"]
    text = dict(TEXT_ENCODER, d_model=text_width, d_kv=64, num_heads=max(1, text_width // 64), d_ff=2 * text_width)
    text.update(num_layers=2)
    torch.manual_seed(0)
    shutil.rmtree(model / "text_encoder")
    UMT5EncoderModel(UMT5Config(vocab_size=vocab, **text)).save_pretrained(str(model / "text_encoder"))
    if device == "cuda":
        torch.cuda.empty_cache()
    return model


def build_data(root: Path) -> tuple[Path, Path]:
    from videogrpo.data.materialize import materialize
    from videogrpo.demo import synthetic_dataset

    tasks = list(synthetic_dataset.TASKS)
    synthetic_dataset.generate(root / "archives", tasks, 2, seed=0, frames=17, height=64, width=64, fps=16)
    dataset = root / "dataset"
    archives = sorted((root / "archives/VBVR-Pro-RL-Video").glob("*.tar.gz"))
    materialize(archives, dataset, tasks, 2, 0, 42, "smoke", {"repo": "synthetic"}, log=lambda _: None)
    kit = root / "evalkit"
    shutil.copytree(REPO / "src/videogrpo/demo/stand_in_evalkit", kit, ignore=shutil.ignore_patterns("__pycache__"))
    return dataset, kit


def run_config(kit: Path, frames: int, height: int, width: int, group: int, steps: int, updates: int, cuda: bool):
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["evalkit"].update(path=str(kit), workers=4, video_size=64)
    cfg["logging"] = {"wandb_mode": "disabled"}
    cfg["video"].update(num_frames=frames, height=height, width=width)
    cfg["grpo"].update(group_size=group, prompts_per_step=1, sampling_steps=steps, delayed_replay=True, clip_range=1e-4)
    cfg["train"].update(max_steps=updates, epochs=50, save_steps=10_000, gradient_checkpointing=True)
    cfg["parallel"].update(procs_per_node=1, data_parallel="fsdp", shard_group_size=1)
    if cuda:  # as the GPU recipes: bf16 compute and frozen models, the offload schedule
        cfg["parallel"].update(device="cuda", backend="nccl", compile=True, param_dtype="bfloat16")
        cfg["model"]["frozen_dtype"] = "bfloat16"
        cfg["train"]["offload_inference_models"] = True
        cfg["grpo"]["decode_batch_size"] = 8
    return cfg


def planned_peak(cfg: dict, model: Path) -> int:
    """The peak preflight's memory plan gives this run (compared with the trainer's measured one)."""
    from videogrpo.config import from_dict
    from videogrpo.preflight import memory_plan

    return memory_plan.plan_for_config(from_dict(cfg), memory_plan.ModelShape.from_model_dir(model)).peak


def train(root: Path, name: str, cfg: dict, model: Path, dataset: Path) -> list[dict]:
    out = root / name
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    argv += ["-m", "videogrpo.grpo.worker", "--config-json", json.dumps(cfg), "--run-id", name]
    for flag, path in (("model", model), ("dataset", dataset), ("evalkit", Path(cfg["evalkit"]["path"]))):
        argv += [f"--{flag}", str(path)]
    for flag in ("checkpoints", "final", "run-dir"):
        argv += [f"--{flag}", str(out / flag)]
    argv += ["--metrics", str(out / "metrics.jsonl")]
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", OMP_NUM_THREADS="4")
    log = root / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as sink:
        code = subprocess.run(argv, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT).returncode
    print(f"{name}: trainer exited {code} after {time.monotonic() - start:.0f} s (log {log})", flush=True)
    if code:
        print(log.read_text()[-4000:], flush=True)
        return []
    layout = json.loads((out / "final/training_state.json").read_text())["layout"]
    print(f"{name}: parameter layout {json.dumps(layout)}", flush=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def training_runs(root: Path, runs: dict, cuda: bool) -> None:
    """Each run's table printed as soon as it ends: a run cut off by a time limit keeps the ones before it."""
    dataset, kit = build_data(root)
    for name, (transformer_cfg, text_width, frames, height, width, group, steps, updates) in runs.items():
        start = time.monotonic()
        model = build_model(root / name, transformer_cfg, text_width)
        print(f"{name}: model built in {time.monotonic() - start:.0f} s", flush=True)
        cfg = run_config(kit, frames, height, width, group, steps, updates, cuda)
        planned = f"{planned_peak(cfg, model) / 2**30:.2f}"
        metrics = train(root, name, cfg, model, dataset)
        shutil.rmtree(root / name / "model", ignore_errors=True)
        blocks, heads = transformer_cfg["num_layers"], transformer_cfg["num_attention_heads"]
        shape = f"{blocks} blocks x {heads} heads, {frames}x{height}x{width}, G={group}, T={steps}"
        rows = [[name, shape, "failed (log above)", "-", "-", "-", "-", "-", planned]] if not metrics else []
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
                    f"{m['peak_memory_bytes'] / 2**30:.2f}",
                    planned,
                ]
            )
        print_table(
            f"GRPO updates through the trainer: {name} (1 process, FSDP2, delayed replay; update 1 includes "
            "compilation)",
            ["run", "shape", "update", "s/update", "rollout / replay s", "tokens/s", "MFU", "peak GiB", "planned GiB"],
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
    compiled_blocks(device, dtype, MID if cuda else CPU_SMALL)
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
