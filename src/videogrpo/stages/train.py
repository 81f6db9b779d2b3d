"""train: launch GRPO training on every machine of the job with torchrun, and record what it made.

Run by the rule once, on the first (or only) machine. The command plays one of four roles (`run` picks it):
- `--preflight-only` (or WAN_TRAINER_TRITON_PREFLIGHT_ONLY=1): just the per-node preflight, on every node of the
  SLURM allocation (srun) or on this machine, one report line per node, exit 0 or 1, training nothing and writing
  no output (launch/node.py's `preflight_only_run`);
- `--node-only`: one node of a multi-node SLURM allocation, started by the first machine's srun; it trains there
  (launch/node.py's `train_this_node`);
- a manual launch's other machine: by hand on a cluster without SLURM, the same command runs on every machine with
  the launch contract set (see launch/torchrun.py); machines 1 and up only train (`train_this_node` too);
- the driver, machine 0 or the only one (`drive`): starts training on every node (srun) or on this machine, then
  writes the outputs and the manifest.

Checkpoints go to <run_dir>/checkpoints/, outside the declared outputs, so that a retried or resubmitted job
resumes from them; for a run in object storage, `--checkpoint-store` mirrors them to the bucket while training
runs (grpo/checkpoint_mirror.py), since a killed job uploads nothing. The run directory is named by the training
contract; execution settings (ports, workers, logging, retention, resources) can change between attempts and the
run still resumes. Each checkpoint records the digests of the training inputs and of the trainer's math code, and
a resume under other inputs or changed math is refused with the reason (grpo/checkpoint.py); a full-state
`resume_from` also needs the topology its checkpoint records (grpo/trainer.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from videogrpo.config import Config, canonical_json, refiner_paths, reward_kinds
from videogrpo.errors import VideoGRPOError
from videogrpo.launch import node, torchrun
from videogrpo.launch.node import NodeTraining
from videogrpo.preflight import node as node_preflight
from videogrpo.provenance import cost, interconnect
from videogrpo.provenance.digest import sha256_bytes
from videogrpo.provenance.manifest import StageRun, record_digest
from videogrpo.provenance.manifest import describe as describe_path
from videogrpo.provenance.metric_rows import training_rows, validation_rows
from videogrpo.stages.common import add_config_argument, load_config

INTERCONNECT_SOURCE = (
    f"--interconnect-env (the train rule's {interconnect.RESOURCE} resource: set-resources: train of your profile)"
)
# Needed to train; a preflight-only run needs only --config-json (argparse cannot say "required unless").
TRAINING_ARGUMENTS = ("manifest", "run_id", "run_dir", "model", "dataset", "preflight", "final", "metrics")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser, manifest_required=False)
    parser.add_argument("--run-id", help="the run identity (names the run directory)")
    parser.add_argument("--run-dir", type=Path, help="run directory (checkpoints go under it)")
    parser.add_argument("--model", type=Path, help="model directory")
    parser.add_argument("--dataset", type=Path, help="materialized dataset directory")
    parser.add_argument("--preflight", type=Path, help="preflight report")
    parser.add_argument("--evalkit", type=Path, help="EvalKit checkout (rule reward; default: evalkit.path)")
    parser.add_argument("--judge-model", type=Path, help="judge model directory the per-node service serves (VLM)")
    parser.add_argument(
        "--kernel-cache", type=Path, help="fetch_kernel's cache, loaded offline (a *_hub attention backend)"
    )
    parser.add_argument(
        "--refiner", action="append", default=[], metavar="NAME=DIR", help="a prompt refiner's download, by name"
    )
    parser.add_argument("--final", type=Path, help="final checkpoint directory to create")
    parser.add_argument("--metrics", type=Path, help="metrics file to create (JSON lines)")
    parser.add_argument(
        "--preflight-only",
        action="store_true",
        help=f"run only the per-node preflight on every machine of the job (or allocation), print one report "
        f"line per node and exit 0 or 1; training never starts (also: {node_preflight.PREFLIGHT_ONLY_VAR}=1)",
    )
    parser.add_argument(
        "--node-only",
        action="store_true",
        help="train on this machine only: no outputs, no manifest (what srun starts per node)",
    )
    parser.add_argument(
        "--checkpoint-store",
        help="s3://bucket/prefix mirroring the checkpoint directory, for a run in object storage",
    )
    parser.add_argument("--checkpoint-store-endpoint", help="the S3 endpoint URL of --checkpoint-store (not AWS)")
    parser.add_argument(
        "--interconnect-env",
        default="",
        help="NCCL_DEBUG=WARN FI_PROVIDER=efa ...: the interconnect settings every node's workers get, unless the "
        "environment sets them (the rule passes the profile's interconnect_env resource)",
    )
    parser.add_argument("--input-digests", help=argparse.SUPPRESS)  # the first node's, handed to the others


def inputs_of(args: argparse.Namespace) -> dict[str, Path | None]:
    return {
        "model": args.model,
        "dataset": args.dataset / "raw",
        "splits": args.dataset / "splits.json",
        "evalkit": args.evalkit,
        "judge_model": args.judge_model,
        "kernel": args.kernel_cache,
        **{f"refiner.{name}": path for name, path in refiner_paths(args.refiner).items()},
    }


def input_digests(args: argparse.Namespace, records: dict | None = None) -> dict[str, str]:
    """What the run trains from, as checkpoints record it: the model and dataset trees and the training ids.

    The EvalKit is pinned by its source digest in the run identity. The ids, not the split file's bytes,
    so that relabelling the split (a cosmetic field) is not a change of the training set.
    """
    trained_from = ("model", "dataset", *(f"refiner.{name}" for name in refiner_paths(args.refiner)))
    if records is None:
        records = {name: describe_path(inputs_of(args)[name], list_files=False) for name in trained_from}
    splits = json.loads((args.dataset / "splits.json").read_text())
    ids = [[entry["task"], entry["rl"]] for entry in splits]
    return {
        **{name: record_digest(records[name]) for name in trained_from},
        "training_ids": sha256_bytes(canonical_json(ids).encode()),
    }


def node_training(args: argparse.Namespace, digests: dict[str, str]) -> NodeTraining:
    return NodeTraining(
        args.config_json,
        args.run_id,
        args.run_dir,
        args.model,
        args.dataset,
        args.final,
        args.metrics,
        digests,
        args.evalkit,
        args.judge_model,
        args.kernel_cache,
        refiner_paths(args.refiner),
    )


def on_every_node(*arguments: str) -> list[str]:
    """This stage's command as srun starts it on each node of the allocation."""
    return [sys.executable, "-m", "videogrpo.cli", "stage", "train", "--node-only", *arguments]


def checkpoint_mirror(store: str | None, endpoint: str | None, checkpoints: Path):
    """The bucket's copy of the checkpoints for a run in object storage (grpo/checkpoint_mirror.py), or nothing."""
    if not store:
        return contextlib.nullcontext()
    from videogrpo.grpo.checkpoint_mirror import CheckpointMirror

    return CheckpointMirror(store, checkpoints, endpoint_url=endpoint)


def evalkit_checkout(cfg: Config, given: Path | None) -> Path | None:
    """The EvalKit checkout the ranks score with: `--evalkit`, else evalkit.path when a reward term is the rule
    reward (the workflow gives none: where the checkout lives is no param, evalkit.digest pins what it is); None
    when no term needs it."""
    if given is not None or "vbvr_rule" not in reward_kinds(cfg):
        return given
    return Path(cfg.evalkit.path)


def run(args: argparse.Namespace) -> int:
    """The role this process plays (the module's opening lists the four), and that role."""
    cfg, sections = load_config(args)
    args.evalkit = evalkit_checkout(cfg, args.evalkit)
    # Into this process's environment, before anything starts: srun hands it to every node, worker_env to the ranks.
    settings = interconnect.parse(args.interconnect_env, INTERCONNECT_SOURCE)
    for note in torchrun.apply_interconnect(settings):
        print(f"[train] {note}", file=sys.stderr, flush=True)
    if node_preflight.preflight_only(args.preflight_only):  # the per-node checks only
        kernel = ["--kernel-cache", str(args.kernel_cache)] if args.kernel_cache else []
        srun = None if args.node_only else on_every_node("--preflight-only", "--config-json", args.config_json, *kernel)
        return node.preflight_only_run(cfg, args.kernel_cache, srun)
    missing = [f"--{name.replace('_', '-')}" for name in TRAINING_ARGUMENTS if getattr(args, name) is None]
    if missing:
        raise VideoGRPOError(
            f"videogrpo stage train: {', '.join(missing)} required (only --preflight-only runs without)"
        )
    if args.node_only:  # one node of the driver's srun, which hands it the first node's input digests
        digests = json.loads(args.input_digests) if args.input_digests else input_digests(args)
        node.train_this_node(cfg, node_training(args, digests))
        return 0
    if not torchrun.needs_srun(cfg) and torchrun.from_environment(cfg).node_rank != 0:  # a manual launch's machine 1+
        node.train_this_node(cfg, node_training(args, input_digests(args)))
        return 0
    return drive(cfg, sections, args)  # the first or only machine


def drive(cfg: Config, sections: dict, args: argparse.Namespace) -> int:
    """The first (or only) machine: training started on every node of the allocation (srun) or on this machine
    inside the stage's record, then the outputs, their checks and the summary written to the manifest."""
    slurm = torchrun.needs_srun(cfg)
    # resume_from (a checkpoint to start from) is recorded with its digest, like every input.
    inputs = dict(inputs_of(args), preflight=args.preflight, resume_from=cfg.train.resume_from)
    external = ("evalkit", "resume_from")  # the pinned checkout; another run's checkpoint, checked on load
    with StageRun(
        "train", args.manifest, inputs=inputs, params=sections, upstream=args.upstream, external=external
    ) as stage:
        digests = input_digests(args, stage.input_records)
        stage.nodes = cfg.parallel.nodes
        parallel = cfg.parallel
        stage.gpus = cost.training_gpus(parallel.nodes, parallel.procs_per_node, parallel.device, os.environ)
        # What this node's ranks see; the other nodes get the same through srun or the Job's spec.
        stage.interconnect = torchrun.workers_interconnect(torchrun.worker_env(cfg))
        checkpoints = args.run_dir / "checkpoints"
        print(f"[train] checkpoints in {checkpoints}", file=sys.stderr, flush=True)
        with checkpoint_mirror(args.checkpoint_store, args.checkpoint_store_endpoint, checkpoints):
            if slurm:
                own = sys.argv[sys.argv.index("train") + 1 :]  # this command's own arguments
                code = node.run_srun(cfg, on_every_node(*own, "--input-digests", json.dumps(digests)))
                if code != 0:
                    raise VideoGRPOError(
                        f"srun exited with code {code}: a node failed (its log lines above say which). "
                        f"Complete checkpoints in {checkpoints} are kept: rerun to resume."
                    )
            else:
                node.train_this_node(cfg, node_training(args, digests))
        from videogrpo.grpo.checkpoint import validate_export  # torch: only here, in the stage's own process

        stage.output("final", args.final)
        stage.output("metrics", args.metrics)
        rows = [json.loads(line) for line in args.metrics.read_text().splitlines() if line]
        lines, validated = training_rows(rows), validation_rows(rows)  # updates; validation points (train.validate_*)
        stage.summary = {
            "updates": len(lines),
            "checkpoints": str(checkpoints),
            "launch": {"nnodes": cfg.parallel.nodes, "nproc": cfg.parallel.procs_per_node, "slurm": slurm},
            "world_size": cfg.world_size,
            "last": {k: v for k, v in (lines[-1] if lines else {}).items() if not isinstance(v, dict)},
            **({"last_validation": validated[-1]} if validated else {}),
            "final_checkpoint": validate_export(args.final, args.model),
        }
        trained = json.loads((args.final / "training_state.json").read_text())
        if "stopped_by_divergence_alarm" in trained:  # train.stop_on_divergence ended it early
            stage.summary["stopped_by_divergence_alarm"] = dict(
                trained["stopped_by_divergence_alarm"], at=trained["updates"]
            )
        if cfg.train.ema_decay is not None:  # ema/ beside final/: the moving average of the trained weights
            ema = args.final.with_name("ema")
            stage.output("ema", ema)
            stage.summary["ema"] = {
                **json.loads((ema / "training_state.json").read_text())["ema"],
                "checkpoint": validate_export(ema, args.model),
            }
        if cfg.train.keep_best_by:  # best/ beside final/: the weights of the best validation point by a gold reward
            best = args.final.with_name("best")
            stage.output("best", best)
            stage.summary["best"] = {
                **json.loads((best / "best.json").read_text()),
                "checkpoint": validate_export(best, args.model),
            }
    return 0
