"""The per-process entry point torchrun starts: `python -m videogrpo.grpo.worker ...`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from pathlib import Path

from videogrpo import config as config_mod
from videogrpo.errors import VideoGRPOError, disk_full_message
from videogrpo.parallel import process_groups
from videogrpo.rewards.judge_service import cap_training_memory


def die_with_the_launcher() -> None:
    """torchrun starts each worker in a session of its own, so a SIGKILLed torchrun (the OOM killer, kill -9 of
    the stage) would leave its workers training, writing checkpoints beside the next attempt's: on Linux the
    kernel kills a worker whose launcher is gone (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
        print(f"[worker] prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}", file=sys.stderr)
    elif os.getppid() != launcher:  # it died before the request took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    die_with_the_launcher()
    # A library logger whose file cannot be written (a full disk) prints a traceback per message, thousands of
    # lines that bury the rank's one error line; such a record is dropped instead, as in production logging.
    logging.raiseExceptions = False
    parser = argparse.ArgumentParser(prog="videogrpo.grpo.worker")
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--run-id", required=True)
    for name in ("model", "dataset", "evalkit", "checkpoints", "final", "metrics", "run-dir"):
        parser.add_argument(f"--{name}", type=Path, required=name != "evalkit")
    parser.add_argument("--input-digests", default="{}", help="digests of the training inputs (JSON)")
    parser.add_argument(
        "--refiner", action="append", default=[], metavar="NAME=DIR", help="a prompt refiner's download, by name"
    )
    args = parser.parse_args(argv)
    from videogrpo.grpo.trainer import Trainer, TrainPaths

    cfg = config_mod.from_dict(config_mod.sections_from_argument(args.config_json), partial=True)
    ctx = process_groups.init(
        cfg.parallel.device,
        cfg.parallel.backend,
        cfg.parallel.cpu_threads,
        group_of_one=cfg.parallel.data_parallel != "replicate",
        train_world=cfg.train_world_size if cfg.has_actors else None,
        stall_timeout_s=cfg.actors.stall_timeout_s,
    )
    # Before any model is loaded: the co-hosted judge's share of this GPU is not training's to take.
    cap = cap_training_memory(cfg, ctx.device)
    node = os.environ.get("SLURMD_NODENAME", "-")
    print(
        f"[rank {ctx.rank}/{ctx.world_size}] host {socket.gethostname()} slurm node {node} device {ctx.device}"
        + (f", capped at {cap:g} of its memory (the judge has the rest)" if cap is not None else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        paths = TrainPaths(
            args.model,
            args.dataset,
            args.evalkit,
            args.checkpoints,
            args.final,
            args.metrics,
            args.run_dir,
            json.loads(args.input_digests),
            config_mod.refiner_paths(args.refiner),
        )
        if ctx.is_actor:
            from videogrpo.grpo.actors import run_actor

            run_actor(cfg, paths, ctx)
        else:
            Trainer(cfg, paths, ctx, args.run_id).run()
    except VideoGRPOError as err:
        print(f"[rank {ctx.rank}] error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: an interruption, not a failing rank
        print(f"[rank {ctx.rank}] interrupted; complete checkpoints are kept, rerun to resume", file=sys.stderr)
        return 130
    except OSError as err:
        if (message := disk_full_message(err, near=args.run_dir)) is None:
            raise
        print(f"[rank {ctx.rank}] error: {message}", file=sys.stderr)
        return 2
    finally:
        process_groups.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
