"""GRPO updates of the real trainer in one process, on the tiny default's inputs with a transformer of any shape:
what the GPU smoke benchmark (bench/gpu_smoke.py) and the GPU test tier (tests/gpu) both run, so that the two
measure the same thing.

`shaped_pipeline` writes the tiny pipeline with a random transformer of a shape from models/shapes.py and a text
encoder of the transformer's text width; `synthetic_inputs` the materialized synthetic dataset and a copy of the
stand-in EvalKit; `one_process_config` layers one process's run (FSDP2 over a mesh of one, one-step-delayed
replay, and on CUDA the GPU recipes' bf16 compute, compiled blocks and offload schedule) on the tiny default's
config; `train_one_process` runs `videogrpo.grpo.worker` under torchrun and returns its metrics lines.

The frozen models stay small (a 2-layer UMT5, the tiny VAE with the real latent layout): a run measures the
transformer's training, not text encoding or video decoding.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

STAND_IN_EVALKIT = Path(__file__).parent / "stand_in_evalkit"


def shaped_pipeline(root: Path, transformer: Mapping, text_width: int) -> Path:
    """`root/model`: the tiny pipeline with a random transformer of shape `transformer` (bf16) and a 2-layer UMT5
    encoder `text_width` wide; built on the GPU when there is one (5B parameters take minutes on a CPU)."""
    import torch
    from diffusers import WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from videogrpo.demo.tiny_ti2v import TEXT_ENCODER, save_tiny_pipeline

    model = root / "model"
    save_tiny_pipeline(model, seed=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        torch.manual_seed(0)
        shaped = WanTransformer3DModel(**transformer).to(torch.bfloat16)
    shutil.rmtree(model / "transformer")
    shaped.save_pretrained(str(model / "transformer"))
    del shaped
    vocab = json.loads((model / "text_encoder/config.json").read_text())["vocab_size"]
    text = dict(TEXT_ENCODER, d_model=text_width, d_kv=64, num_heads=max(1, text_width // 64), d_ff=2 * text_width)
    text.update(num_layers=2)
    torch.manual_seed(0)
    shutil.rmtree(model / "text_encoder")
    UMT5EncoderModel(UMT5Config(vocab_size=vocab, **text)).save_pretrained(str(model / "text_encoder"))
    if device == "cuda":
        torch.cuda.empty_cache()
    return model


def synthetic_inputs(root: Path) -> tuple[Path, Path]:
    """(dataset, evalkit) under `root`: 2 samples of each synthetic task, materialized, and the stand-in EvalKit."""
    from videogrpo.data.materialize import materialize
    from videogrpo.demo import synthetic_dataset

    tasks = list(synthetic_dataset.TASKS)
    synthetic_dataset.generate(root / "archives", tasks, 2, seed=0, frames=17, height=64, width=64, fps=16)
    dataset = root / "dataset"
    archives = sorted((root / "archives/VBVR-Pro-RL-Video").glob("*.tar.gz"))
    materialize(archives, dataset, tasks, 2, 0, 42, "smoke", {"repo": "synthetic"}, log=lambda _: None)
    kit = root / "evalkit"
    shutil.copytree(STAND_IN_EVALKIT, kit, ignore=shutil.ignore_patterns("__pycache__"))
    return dataset, kit


def one_process_config(
    defaults: dict,
    kit: Path,
    frames: int,
    height: int,
    width: int,
    group: int,
    steps: int,
    updates: int,
    cuda: bool,
) -> dict:
    """One process's run on the tiny default's config `defaults` (config/config.yaml, read by the caller and left
    as it is): `group` rollouts of `steps` steps per update, `updates` updates, videos frames x height x width."""
    cfg = copy.deepcopy(defaults)
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


def train_one_process(root: Path, name: str, cfg: dict, model: Path, dataset: Path) -> list[dict]:
    """The trainer under torchrun (one process) writing to `root/name`; its metrics lines, or [] when it failed
    (the end of its log, `root/<name>.log`, printed). Runs in the caller's working directory."""
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
        code = subprocess.run(argv, env=env, stdout=sink, stderr=subprocess.STDOUT).returncode
    print(f"{name}: trainer exited {code} after {time.monotonic() - start:.0f} s (log {log})", flush=True)
    if code:
        print(log.read_text()[-4000:], flush=True)
        return []
    layout = json.loads((out / "final/training_state.json").read_text())["layout"]
    print(f"{name}: parameter layout {json.dumps(layout)}", flush=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
