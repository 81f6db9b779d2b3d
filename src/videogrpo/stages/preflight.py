"""preflight: the resolved config and the runtime, checked before training; a report, or a loud failure."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from videogrpo import atomic
from videogrpo.config import uses_hub_kernel, uses_tracker
from videogrpo.errors import VideoGRPOError
from videogrpo.preflight import checks as preflight
from videogrpo.provenance.manifest import StageRun
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--model", required=True, type=Path, help="model directory")
    parser.add_argument("--model-manifest", required=True, type=Path, help="fetch_model's manifest")
    parser.add_argument("--dataset", required=True, type=Path, help="materialized dataset directory")
    parser.add_argument("--validation", required=True, type=Path, help="validate_dataset's report")
    parser.add_argument("--evalkit-fingerprint", type=Path, help="fingerprint_evalkit's record (rule reward)")
    parser.add_argument("--scorer-runtime", type=Path, help="check_scorer_runtime's record (rule reward)")
    parser.add_argument("--kernel-cache", type=Path, help="fetch_kernel's cache (a *_hub attention backend)")
    parser.add_argument("--kernel-manifest", type=Path, help="fetch_kernel's manifest (a *_hub attention backend)")
    parser.add_argument("--out", required=True, type=Path, help="preflight report (JSON)")


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    inputs = {
        "model": args.model,
        "model_manifest": args.model_manifest,
        "validation": args.validation,
        "evalkit_fingerprint": args.evalkit_fingerprint,
        "scorer_runtime": args.scorer_runtime,
        # The kernel cache itself is checked file by file by check_attention_kernel, which names what differs.
        "kernel_manifest": args.kernel_manifest,
    }
    with StageRun("preflight", args.manifest, inputs=inputs, params=sections, upstream=args.upstream) as stage:
        checks = [
            preflight.check_config(cfg),
            preflight.check_model_dir(args.model, args.model_manifest, preflight.trained_transformers(cfg)),
            preflight.check_flow_shift(cfg, args.model),
            preflight.check_dataset(args.validation, args.dataset, cfg.grpo.prompts_per_step),
            preflight.check_video_io(),
            preflight.check_disk_space(cfg, args.model, args.out.parent),
        ]
        memory, plan = preflight.check_memory_plan(cfg, args.model)
        checks.append(memory)
        checks += preflight.reward_checks(cfg, args.evalkit_fingerprint, args.dataset)
        if uses_tracker(cfg.logging, "mlflow"):
            checks.append(preflight.check_mlflow(cfg))
        if uses_hub_kernel(cfg):
            checks.append(preflight.check_attention_kernel(cfg, args.kernel_cache, args.kernel_manifest))
        # This job holds one GPU (cluster_resources("preflight")); the launcher checks procs_per_node on every
        # training node.
        checks += preflight.node_checks(cfg, devices=1)
        report = dict(preflight.as_report(checks), memory_plan=plan)
        for check in checks:
            print(f"[{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}", file=sys.stderr)
        if not report["ok"]:
            failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
            raise VideoGRPOError("preflight failed:\n  " + "\n  ".join(failed))
        atomic.write_json(args.out, report)
        stage.output("preflight", args.out)
        stage.summary = {"checks": len(checks)}
    return 0
