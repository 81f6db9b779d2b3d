"""`videogrpo`: the commands a person runs (config, simulate, plan, schema, verify, diff, trace), and under
`videogrpo stage` the command of each workflow rule, which the rules call (`rule fetch_model` runs
`videogrpo stage fetch-model`).

Exit codes: 0 success, 1 unexpected error (a bug: traceback printed), 2 a user-facing failure,
3 invalid configuration, 4 digest mismatch (also `verify` finding a changed, missing or added file),
5 bad data, 130 interrupted. `diff` exits 1 when the runs differ, as diff(1) does; `plan` exits 2 when no layout
of the recipe's training contract fits.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys
from pathlib import Path

from videogrpo import __version__
from videogrpo.errors import VideoGRPOError, disk_full_message
from videogrpo.stages import STAGES, log_reserve

CONFIG_HELP = "overrides as snakemake's --config takes them, e.g. 'train={lr: 1e-5}' (--set wins)"


class _Parser(argparse.ArgumentParser):
    """No abbreviated options: `--config` must never be read as `--configfile`, nor any other prefix as a flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _stage_help(name: str) -> str:
    """The first line of a stage module's docstring, read from its source: listing the commands imports none."""
    source = Path(__file__).parent / "stages" / f"{name}.py"
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0].split(": ", 1)[-1]


def _merge(into: dict, layer: dict) -> dict:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _overrides(items: list[str] | None, snakemake_items: list[str] | None = None) -> dict:
    """`--config section=value` items as Snakemake reads them (`train={lr: 1e-4}`, `results=/scratch/x`), then
    `--set section.field=value` items over them; values parsed as YAML."""
    import yaml

    overrides: dict = {}
    for item in snakemake_items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise VideoGRPOError(f"--config {item!r}: give SECTION=VALUE, as for snakemake, e.g. 'train={{lr: 1e-4}}'")
        _merge(overrides, {key: yaml.safe_load(value)})
    for item in items or []:
        key, _, value = item.partition("=")
        node: dict = {}
        layer = node
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
        _merge(overrides, layer)
    return overrides


def _config_command(args: argparse.Namespace) -> int:
    import yaml

    from videogrpo import config

    overrides = _overrides(args.set, args.config)
    cfg = config.load(args.configfile or [Path("config/config.yaml")], overrides)
    if overrides and not args.run_id:  # Snakemake's own parser refuses dotted keys such as train.lr=...
        forms = " ".join(
            f"'{section}={yaml.safe_dump(values, default_flow_style=True).strip()}'"
            for section, values in overrides.items()
        )
        print(f"# the same overrides for snakemake: --config {forms}")
    if args.run_id:
        print(config.run_identity(cfg))
        return 0
    print(f"# run identity: {config.run_identity(cfg)}  (world size {cfg.world_size})")
    for warning in config.setting_warnings(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    print(yaml.safe_dump(config.to_dict(cfg), sort_keys=False), end="")
    return 0


def _rank_list(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give ranks as comma-separated integers, e.g. 0,9,127") from None


def gpu_names() -> str:
    """The GPUs `plan` and `compare` know by name (their memory and bf16 peak), from the planner's own table."""
    from videogrpo.preflight.plan_assumptions import GPU_MEMORY_GIB

    return ", ".join(sorted(GPU_MEMORY_GIB))


def planner_options() -> list[tuple[str, str]]:
    """The time model's settable assumptions and their help, from the planner's own field docs."""
    from videogrpo.preflight.plan_assumptions import TUNABLE, Assumptions

    return [(name, f"default {getattr(Assumptions(), name):g}") for name in TUNABLE]


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of at least 1")
    return int(value)


def _simulate_command(args: argparse.Namespace) -> int:
    import time

    from videogrpo import config
    from videogrpo.preflight.simulate import simulate

    cfg = config.load(args.configfile or [Path("config/config.yaml")], _overrides(args.set, args.config))
    started = time.monotonic()
    jobs = args.jobs or len(os.sched_getaffinity(0))
    log = lambda line: print(line, flush=True)  # noqa: E731
    results = simulate(cfg, args.ranks, steps=not args.no_steps, log=log, jobs=jobs)
    print(
        f"{len(results)} ranks of {cfg.train_world_size} checked in {time.monotonic() - started:.0f} s "
        + f"({jobs} at a time"
        + (f"; {cfg.world_size - cfg.train_world_size} rollout actors beside them" if cfg.has_actors else "")
        + "): "
        "every parameter's "
        "shard, the training state's bytes and the checkpoint plan as the memory plan and layout say"
        + ("" if args.no_steps else ", and a rollout and a replay step on fake tensors")
    )
    return 0


def _plan_command(args: argparse.Namespace) -> int:
    from videogrpo import config
    from videogrpo.atomic import write_text
    from videogrpo.errors import ConfigError
    from videogrpo.preflight import planner

    cfg = config.load(args.configfile or [Path("config/config.yaml")], _overrides(args.set, args.config))
    gpu = args.gpu.lower()
    if gpu not in planner.GPU_MEMORY_GIB:  # its bf16 peak, which the time model needs, is not known either
        raise ConfigError(
            f"--gpu {args.gpu}: not a GPU the planner knows (its bf16 peak and memory); give one of "
            f"{', '.join(sorted(planner.GPU_MEMORY_GIB))}, the nearest to yours, with --gpu-memory GIB for its memory"
        )
    memory = args.gpu_memory if args.gpu_memory is not None else planner.GPU_MEMORY_GIB[gpu]
    nodes = args.nodes or (1 if args.gpus <= 8 else max(1, args.gpus // 8))
    given = {name: getattr(args, name) for name in planner.TUNABLE if getattr(args, name) is not None}
    assume = planner.Assumptions(gpu=gpu, **given)
    outcome = planner.plan_lines(
        cfg, args.gpus, nodes, memory, args.host_memory, assume, args.top, changes=args.contract_changes
    )
    print("\n".join(outcome.lines), flush=True)
    if args.actors:
        from videogrpo.preflight import actor_planner

        best = outcome.fitting[0].total_s if outcome.fitting else None
        shape = planner.released_shape(cfg)
        lines = actor_planner.actor_lines(cfg, args.gpus, nodes, memory, args.host_memory, assume, shape, best)
        print("\n".join(lines), flush=True)
    if args.write is None:
        return 0 if outcome.fitting else 2  # a contract change is another run, not the recipe fitting
    rows = {str(i + 1): row for i, row in enumerate(outcome.fitting)}
    rows.update({f"c{i + 1}": row for i, row in enumerate(outcome.contract_rows)})
    pick = args.pick or ("1" if outcome.fitting else None)
    if pick not in rows:
        raise VideoGRPOError(
            f"--pick {pick}: choose a row shown above ({', '.join(rows) or 'none fits'}); nothing written"
            if pick
            else "no layout of the recipe's contract fits: pick a contract change row (--pick c1 ...); nothing written"
        )
    source = " ".join(str(f) for f in args.configfile or ["config/config.yaml"])
    write_text(args.write, planner.layer_text(rows[pick], memory, source))
    print(f"wrote row {pick} to {args.write}: snakemake --configfile {source} {args.write}")
    return 0


def _schema_command(args: argparse.Namespace) -> int:
    from videogrpo.config import json_schema
    from videogrpo.config.docs import markdown_reference

    if args.markdown:
        print(markdown_reference(json_schema()), end="")
    else:
        print(json.dumps(json_schema(), indent=2))
    return 0


def _verify_command(args: argparse.Namespace) -> int:
    from videogrpo.provenance.verify import verify_run

    return 0 if not verify_run(args.run_dir).problems else 4


def _diff_command(args: argparse.Namespace) -> int:
    from videogrpo.provenance.verify import diff_runs

    if len(args.runs) != 2:
        given = " ".join(map(str, args.runs)) or "none"
        raise VideoGRPOError(
            f"diff compares two run directories; given {len(args.runs)} ({given}). Right after `make demo` there "
            f"is one run: make another, e.g. `snakemake --cores 2 --config 'train={{lr: 2.0e-4, max_steps: 2}}'`, "
            f"then `videogrpo diff $(ls -d results/runs/tiny-* | head -2)`"
        )
    return diff_runs(*args.runs)


def _compare_command(args: argparse.Namespace) -> int:
    from videogrpo import atomic
    from videogrpo.evaluation import comparison
    from videogrpo.preflight.plan_assumptions import Assumptions

    if len(args.runs) < 2:
        raise VideoGRPOError(f"compare takes two or more run directories; given {len(args.runs)}")
    assume = Assumptions(gpu=args.gpu, mfu=args.mfu)
    presets = comparison.read_presets(args.presets)
    runs = [comparison.load_run(run, presets) for run in args.runs]
    peak = assume.peak_flops
    assumption = f"{assume.gpu} at its dense bf16 peak of {peak / 1e12:,.0f} TFLOP/s and MFU {assume.mfu:g}"
    found = comparison.tables(runs, peak, assume.mfu)
    atomic.write_text(args.out, comparison.render_html(runs, found, peak, assume.mfu, assumption))
    print("\n".join(comparison.summary_lines(found)))
    print(f"wrote {args.out}")
    return 0


def _trace_command(args: argparse.Namespace) -> int:
    from videogrpo.provenance.trace import tsv
    from videogrpo.provenance.verify import run_rows

    sys.stdout.write(tsv(run_rows(args.run_dir, sacct=not args.no_sacct)))
    return 0


def _check_storage_command(args: argparse.Namespace) -> int:
    from videogrpo.pipeline import object_storage

    endpoint = args.endpoint_url or os.environ.get(object_storage.ENDPOINT_VARIABLE)
    found = object_storage.problems(args.prefix, endpoint)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if found:
        return 2
    where = f"the endpoint {endpoint}" if endpoint else "AWS S3"
    print(f"object storage: {args.prefix} on {where}, with keys: Snakemake's S3 plugin can start")
    return 0


def _stage_group(sub, command: str | None) -> None:
    """`videogrpo stage NAME`: the command of each workflow rule (and k8s-job, which the train rule wraps around
    training under profiles/kubernetes); only the stage named `command` is imported to declare its arguments."""
    group = sub.add_parser(
        "stage",
        help="run one workflow stage as its rule does (`videogrpo stage --help` lists them); Snakemake calls these",
        description="The command of each workflow rule: Snakemake runs these with the paths and config file of "
        "the run; a person rarely does (rerun one stage with `snakemake --forcerun <rule>` instead).",
    )
    stages = group.add_subparsers(dest="stage", metavar="STAGE", required=True)
    for name in STAGES:
        stage = stages.add_parser(name.replace("_", "-"), help=_stage_help(name))
        if command in (None, name.replace("_", "-")):
            importlib.import_module(f"videogrpo.stages.{name}").add_arguments(stage)
        stage.set_defaults(
            handler=lambda args, name=name: importlib.import_module(f"videogrpo.stages.{name}").run(args)
        )
    k8s = stages.add_parser(
        "k8s-job", help="multi-node training on Kubernetes: write one indexed Job and its Service, apply, wait"
    )
    if command in (None, "k8s-job"):
        importlib.import_module("videogrpo.launch.k8s_job").add_arguments(k8s)
    k8s.set_defaults(handler=lambda args: importlib.import_module("videogrpo.launch.k8s_job").run(args))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI; under `stage`, only the stage named `command` (None: every stage) is imported to declare its
    arguments, so a light stage never pays for importing torch."""
    parser = _Parser(
        prog="videogrpo",
        description="GRPO for Wan2.2 video models as a Snakemake workflow with provenance: run the workflow with "
        "`snakemake --cores N` (or a profile); these commands inspect and check what it makes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--version", action="version", version=f"videogrpo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    show = sub.add_parser("config", help="print the resolved config and its run identity, or the first error")
    # Repeated flags add layers (`--configfile a.yaml --configfile b.yaml` is `--configfile a.yaml b.yaml`):
    # a later flag must not silently drop the layers an earlier one named.
    show.add_argument(
        "--configfile",
        nargs="+",
        action="extend",
        type=Path,
        help="YAML layers, later ones win (default: config/config.yaml)",
    )
    show.add_argument(
        "--set", nargs="*", action="extend", metavar="SECTION.FIELD=VALUE", help="overrides, e.g. train.lr=1e-5"
    )
    show.add_argument("--config", nargs="+", action="extend", metavar="SECTION=VALUE", help=CONFIG_HELP)
    show.add_argument("--run-id", action="store_true", help="print only the run identity (the run directory's name)")
    show.set_defaults(handler=_config_command)
    sim = sub.add_parser(
        "simulate",
        help="check a recipe at its real world size and model shape on this CPU (torch's fake process group)",
        description="Build the recipe's real-shape transformer(s) on the meta device and this project's FSDP/HSDP "
        "and tensor-parallel layout on torch's fake process group at the recipe's world size, for a set of ranks; "
        "check every parameter's shard and the training state's bytes against the memory plan, the checkpoint's "
        "save plan, and run one rollout and one replay step on fake tensors. Exit 0: all equal; 2: a difference "
        "(listed); 3: the config is invalid at this scale (as preflight says).",
    )
    sim.add_argument("--configfile", nargs="+", action="extend", type=Path, help="YAML layers (as for `config`)")
    sim.add_argument(
        "--set", nargs="*", action="extend", metavar="SECTION.FIELD=VALUE", help="overrides, e.g. parallel.nodes=4"
    )
    sim.add_argument("--config", nargs="+", action="extend", metavar="SECTION=VALUE", help=CONFIG_HELP)
    sim.add_argument(
        "--ranks",
        type=_rank_list,
        help="comma-separated ranks to check (default: first, last, each shard group's first)",
    )
    sim.add_argument("--no-steps", action="store_true", help="only the shards and the checkpoint plan (seconds a rank)")
    sim.add_argument(
        "--jobs",
        type=_positive_int,
        help="ranks simulated at a time, each in its own process (default: the CPU cores this process may use)",
    )
    sim.set_defaults(handler=_simulate_command)
    plan = sub.add_parser(
        "plan",
        help="the layouts a recipe trains in on your GPUs: memory per phase and modelled time per update",
        description="Search the layouts that keep the recipe's training contract (FSDP/HSDP shard groups, tensor "
        "parallel, prompts per rank, rollout and decode chunks, gradient checkpointing, offload) on --gpus GPUs of "
        "--gpu-memory GiB; print those that fit, best modelled time first, the nearest that do not with what breaks "
        "each, and where none fits the contract changes that do (each a new run). Every assumption of the time model "
        "is printed and settable. Exit 0: a layout fits; 2: none fits; 3: the input cannot be planned.",
    )
    plan.add_argument("--configfile", nargs="+", action="extend", type=Path, help="YAML layers (as for `config`)")
    plan.add_argument(
        "--set", nargs="*", action="extend", metavar="SECTION.FIELD=VALUE", help="overrides, e.g. video.num_frames=49"
    )
    plan.add_argument("--config", nargs="+", action="extend", metavar="SECTION=VALUE", help=CONFIG_HELP)
    plan.add_argument("--gpus", type=int, required=True, help="GPUs in all")
    plan.add_argument("--gpu-memory", type=float, metavar="GIB", help="memory of one GPU (default: --gpu's)")
    plan.add_argument("--nodes", type=_positive_int, help="machines (default: 1 up to 8 GPUs, else GPUs / 8)")
    plan.add_argument("--host-memory", type=float, metavar="GIB", help="memory of one node (default: not limited)")
    plan.add_argument("--gpu", default="h100", help=f"GPU name for its bf16 peak and memory ({gpu_names()})")
    for name, help_text in planner_options():
        plan.add_argument(f"--{name.replace('_', '-')}", type=float, help=help_text)
    plan.add_argument("--top", type=_positive_int, default=5, help="fitting layouts shown (default 5)")
    plan.add_argument(
        "--contract-changes",
        action="store_true",
        help="also show the contract changes (LoRA, fewer prompts, ...) that fit when the recipe's own layouts do",
    )
    plan.add_argument(
        "--actors",
        action="store_true",
        help="also split the GPUs into train ranks and rollout actors (the actors section), with modelled times",
    )
    plan.add_argument("--write", type=Path, metavar="FILE", help="write the picked row as a config layer")
    plan.add_argument("--pick", help="the row --write writes: 1, 2, ... or c1, ... (default: 1)")
    plan.set_defaults(handler=_plan_command)
    schema = sub.add_parser(
        "schema", help="print the JSON Schema of the config (workflow/schemas is generated from it)"
    )
    schema.add_argument(
        "--markdown", action="store_true", help="the same reference as Markdown (config/README.md is generated from it)"
    )
    schema.set_defaults(handler=_schema_command)
    verify = sub.add_parser("verify", help="re-hash every output a run's manifests record; exit 0 only if all match")
    verify.add_argument("run_dir", type=Path, help="results/runs/<run> (run from the workflow directory)")
    verify.set_defaults(handler=_verify_command)
    diff = sub.add_parser(
        "diff", help="the config fields, output digests and final metrics two runs differ in, and their cost"
    )
    diff.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR", help="the two run directories to compare")
    diff.set_defaults(handler=_diff_command)
    compare = sub.add_parser(
        "compare",
        help="a page of several runs side by side: held-out changes, paired differences, reward per GPU-hour",
        description="Write an HTML page comparing two or more complete runs (say, one per grpo.algorithm): what "
        "they differ in, each run's held-out change against the base with its interval, the paired difference of "
        "each run from the first under every sampler all their matrices share, reward per update and per modelled "
        "GPU-hour (the FLOPs the metrics record at --gpu's peak and --mfu), and wall time per update. Every file read "
        "is checked against its manifest's digest.",
    )
    compare.add_argument(
        "runs", type=Path, nargs="+", metavar="RUN_DIR", help="the run directories, the first the baseline"
    )
    compare.add_argument("--out", type=Path, default=Path("comparison.html"), help="the page to write")
    compare.add_argument("--gpu", default="h100", help=f"GPU whose bf16 peak models the GPU-hours ({gpu_names()})")
    compare.add_argument("--mfu", type=float, default=0.30, help="share of the peak assumed reached (as for plan)")
    compare.add_argument(
        "--presets",
        type=Path,
        default=Path("config/algorithms"),
        help="the algorithm presets a run is named by when it has every setting of one (default: config/algorithms)",
    )
    compare.set_defaults(handler=_compare_command)
    trace = sub.add_parser(
        "trace",
        help="every stage job of a run as TSV: name, SLURM job id, state, host, start, end, wall, CPU-h, GPUs, GPU-h",
        description="Print the run's trace as TSV, one line per stage job (the run's own stages and the shared "
        "ones it used), by start time, from the stage manifests' cost blocks. Columns: name, job_id (the SLURM "
        "job, '-' outside SLURM), state (sacct's final state when sacct answers, else the manifest's "
        "COMPLETED), host, start and end (UTC, ISO 8601), wall_s, cpu_h (this host's processes), gpus, gpu_h "
        "(gpus x wall hours); '-' where a manifest predates the cost block.",
    )
    trace.add_argument("run_dir", type=Path, help="results/runs/<run> (run from the workflow directory)")
    trace.add_argument("--no-sacct", action="store_true", help="never ask sacct; states as the manifests record")
    trace.set_defaults(handler=_trace_command)
    storage = sub.add_parser(
        "check-storage",
        help="check a bucket prefix, its endpoint and the keys before a run in object storage (one line each)",
        description="Check what Snakemake's S3 plugin needs before Snakemake reads it: the --default-storage-prefix "
        "(s3://<bucket>/<folder>), the endpoint (SNAKEMAKE_STORAGE_S3_ENDPOINT_URL, or --endpoint-url; unset for AWS "
        "S3) and the bucket's keys (the environment or ~/.aws/credentials). Reads no object. Exit 0: all set; 2: "
        "what is wrong, one line each.",
    )
    storage.add_argument("prefix", help="the run's --default-storage-prefix, s3://<bucket>/<folder>")
    storage.add_argument("--endpoint-url", help="the S3 endpoint (default: $SNAKEMAKE_STORAGE_S3_ENDPOINT_URL)")
    storage.set_defaults(handler=_check_storage_command)
    _stage_group(sub, command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    words = [arg for arg in argv if not arg.startswith("-")]
    stage = words[1] if len(words) > 1 and words[0] == "stage" else None  # the one stage whose arguments to load
    args = build_parser(stage).parse_args(argv)
    with log_reserve.room_for_the_last_line() as make_room:
        try:
            return args.handler(args)
        except VideoGRPOError as err:
            make_room()
            print(f"error: {err}", file=sys.stderr, flush=True)
            return err.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `videogrpo config | head`: the reader left, nothing is wrong
            sys.stderr.close()
            return 0
        except OSError as err:
            if (message := disk_full_message(err)) is None:
                raise
            make_room()
            print(f"error: {message}", file=sys.stderr, flush=True)
            return 2


if __name__ == "__main__":
    sys.exit(main())
