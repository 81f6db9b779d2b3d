"""train: launch GRPO training with torchrun on this machine and record what it made.

Checkpoints go to <run_dir>/checkpoints/<key>/, outside the declared outputs, keyed by the digests of
the model, the data, the EvalKit and the trainer code, so that a retried or resubmitted job resumes
from them and changed inputs never resume from a checkpoint trained on other ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import videogrpo
from videogrpo import launch
from videogrpo.config import canonical_json
from videogrpo.errors import VideoGRPOError
from videogrpo.provenance.digest import package_digest, sha256_bytes
from videogrpo.provenance.manifest import StageRun, record_digest
from videogrpo.stages import CODE_PARTS
from videogrpo.stages.common import add_config_argument, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--run-id", required=True, help="the run identity (names the run directory)")
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory (checkpoints go under it)")
    parser.add_argument("--model", required=True, type=Path, help="model directory")
    parser.add_argument("--dataset", required=True, type=Path, help="materialized dataset directory")
    parser.add_argument("--preflight", required=True, type=Path, help="preflight report")
    parser.add_argument("--evalkit", type=Path, help="EvalKit checkout (rule reward)")
    parser.add_argument("--final", required=True, type=Path, help="final checkpoint directory to create")
    parser.add_argument("--metrics", required=True, type=Path, help="metrics file to create (JSON lines)")


def checkpoint_key(stage: StageRun, sections: dict) -> str:
    """Digest of what training depends on: input contents, config sections and the trainer's code.

    Checkpoints made from other inputs or by other trainer code are never resumed silently; to continue
    from them on purpose, point train.resume_from at one (with reset_dataloader: false).
    """
    contents = {name: record_digest(rec) for name, rec in stage.input_records.items() if name != "preflight"}
    code = package_digest(Path(videogrpo.__file__).parent, CODE_PARTS["train"])
    return sha256_bytes(canonical_json({"inputs": contents, "config": sections, "code": code}).encode())[:12]


def run(args: argparse.Namespace) -> int:
    cfg, sections = load_config(args)
    where = launch.from_environment(cfg)
    inputs = {"model": args.model, "dataset": args.dataset / "raw", "splits": args.dataset / "splits.json",
              "evalkit": args.evalkit, "preflight": args.preflight}
    with StageRun("train", args.manifest, inputs=inputs, params=sections) as stage:
        checkpoints = args.run_dir / "checkpoints" / checkpoint_key(stage, sections)
        worker_args = ["--config-json", args.config_json, "--run-id", args.run_id, "--model", str(args.model),
                       "--dataset", str(args.dataset), "--checkpoints", str(checkpoints), "--final", str(args.final),
                       "--metrics", str(args.metrics), "--run-dir", str(args.run_dir)]
        if args.evalkit:
            worker_args += ["--evalkit", str(args.evalkit)]
        argv = launch.torchrun_argv(where, "videogrpo.grpo.worker", worker_args)
        print(f"[train] launching {where.nnodes} x {where.nproc} processes; checkpoints in {checkpoints}",
              file=sys.stderr, flush=True)
        code = subprocess.run(argv, check=False).returncode
        if code != 0:
            raise VideoGRPOError(f"torchrun exited with code {code}; the log above has the failing rank's error. "
                                 f"Complete checkpoints in {checkpoints} are kept: rerun to resume.")
        stage.output("final", args.final)
        stage.output("metrics", args.metrics)
        lines = [json.loads(line) for line in args.metrics.read_text().splitlines() if line]
        stage.summary = {"updates": len(lines), "checkpoints": str(checkpoints), "launch": where.__dict__,
                         "world_size": where.nnodes * where.nproc,
                         "last": {k: v for k, v in (lines[-1] if lines else {}).items() if not isinstance(v, dict)}}
    return 0
