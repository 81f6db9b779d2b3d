"""Preflight: everything that can be checked before a model is loaded or a GPU hour is spent.

Each check returns a `Check` naming what was checked, whether it passed, and on failure the field or
file at fault and the fix. `node_checks` are the per-machine part the launcher also runs on every
node of a multi-node job (their facts and decisions in node_preflight.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import tempfile
from dataclasses import asdict
from pathlib import Path

from videogrpo.artifacts.weights import WeightsError, directory_numels
from videogrpo.config import Config, problems, reward_kinds
from videogrpo.preflight import node as node_preflight
from videogrpo.preflight.node import Check
from videogrpo.provenance import digest

# diffusers attention backends that need an extra package (the rest ship with torch).
BACKEND_PACKAGES = {
    "flash": "flash_attn",
    "flash_varlen": "flash_attn",
    "_flash_3": "flash_attn_interface",
    "_flash_3_hub": "kernels",
    "flash_hub": "kernels",
    "_flash_3_varlen_hub": "kernels",
    "sage": "sageattention",
    "sage_varlen": "sageattention",
    "xformers": "xformers",
}


def check_config(cfg: Config) -> Check:
    found = problems(cfg)
    return Check("config", not found, "all fields and cross-field rules hold" if not found else "; ".join(found))


def check_mlflow(cfg: Config) -> Check:
    """$MLFLOW_TRACKING_URI is set and its server opens the experiment (a few quick tries, not MLflow's minutes of
    retries): a wrong URI or credentials fail here, not after the first GPU hour."""
    from videogrpo.errors import VideoGRPOError
    from videogrpo.grpo import mlflow_run

    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
    before = {name: os.environ.get(name) for name in quick}
    os.environ.update({name: value for name, value in quick.items() if before[name] is None})
    try:
        run = mlflow_run.Server(cfg.logging.mlflow_experiment)
    except VideoGRPOError as err:
        return Check("mlflow", False, str(err))
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
    return Check(
        "mlflow",
        True,
        f"{mlflow_run.redacted(run.uri)}: experiment {cfg.logging.mlflow_experiment!r} ({run.experiment_id}) opens",
    )


def trained_transformers(cfg: Config) -> tuple[str, ...]:
    """The transformer folders the run loads and trains (memory_plan.trained_transformers of model.kind and
    train.experts)."""
    from videogrpo.preflight.memory_plan import trained_transformers as folders

    return folders(cfg.model.kind, cfg.train.experts)


def check_model_dir(model_dir: Path, manifest: Path, transformers: tuple[str, ...] = ("transformer",)) -> Check:
    """The pipeline directory is complete (the trained `transformers` folders included) and is what fetch_model
    recorded."""
    needed = ["model_index.json", *(f"{name}/config.json" for name in transformers)]
    needed += ["vae/config.json", "text_encoder/config.json"]
    missing = [n for n in needed if not (model_dir / n).is_file()]
    if missing:
        return Check("model_dir", False, f"{model_dir}: missing {missing}; rerun fetch_model")
    if "transformer_2" in transformers:
        from videogrpo.models.i2v import transformer_2_named

        if not transformer_2_named(model_dir):
            return Check(
                "model_dir",
                False,
                f"{model_dir}: model_index.json names no transformer_2, so the pipeline has no low-noise expert to "
                f"train; use a two-expert Wan2.2 I2V-A14B pipeline, or train.experts: high",
            )
    recorded = json.loads(manifest.read_text())["outputs"]["model"]["tree_sha256"]
    found = digest.tree_digest(model_dir)
    if found != recorded:
        return Check(
            "model_dir",
            False,
            f"{model_dir}: tree digest {found} differs from {recorded} recorded by "
            f"fetch_model; the directory was modified: rerun fetch_model",
        )
    return Check("model_dir", True, f"{model_dir}: complete, tree digest {found} as recorded")


def check_flow_shift(cfg: Config, model_dir: Path) -> Check:
    """The flow shift training samples with, and where it comes from (the model, or grpo.shift)."""
    from videogrpo.errors import ConfigError
    from videogrpo.models.wan import flow_shift

    try:
        shift, source = flow_shift(cfg, model_dir)
    except ConfigError as err:
        return Check("flow_shift", False, str(err))
    return Check("flow_shift", True, f"flow shift {shift} ({source})")


def check_evalkit(cfg: Config, fingerprint_file: Path) -> Check:
    record = json.loads(fingerprint_file.read_text())
    found = digest.evalkit_source_digest(cfg.evalkit.path)
    ok = found == record["source_sha256"] == cfg.evalkit.digest
    detail = (
        f"{cfg.evalkit.path}: source digest {found} = evalkit.digest"
        if ok
        else f"{cfg.evalkit.path}: source digest {found}, fingerprinted {record['source_sha256']}, "
        f"pinned evalkit.digest {cfg.evalkit.digest}; restore the checkout or pin the new digest"
    )
    return Check("evalkit_digest", ok, detail)


def check_evalkit_tasks(cfg: Config, dataset_dir: Path) -> Check:
    """The dataset's tasks the checkout's TASK_EVALUATOR_MAP knows, as a scorer worker imports it: a process of
    evalkit.python started by the pool's own code, in the checkout, CUDA hidden (the runtime contract is
    check_scorer_runtime's, and every training worker's, to check)."""
    from videogrpo.errors import VideoGRPOError
    from videogrpo.rewards.rule import RuleScorer

    tasks = sorted({entry["task"] for entry in json.loads((dataset_dir / "splits.json").read_text())})
    checkout = Path(cfg.evalkit.path).resolve()
    try:
        with RuleScorer(checkout, 1, 1, easyocr_models=cfg.evalkit.easyocr_models, python=cfg.evalkit.python) as one:
            known = set(one.tasks)
    except VideoGRPOError as err:
        return Check("evalkit_tasks", False, f"listing the EvalKit's tasks (vbvr_bench.evaluators) failed: {err}")
    unknown = [t for t in tasks if t not in known]
    if len(unknown) == len(tasks):
        return Check(
            "evalkit_tasks",
            False,
            f"none of the dataset's {len(tasks)} tasks ({_first_few(tasks)}) is in the TASK_EVALUATOR_MAP of "
            f"{checkout}, which has {len(known)} ({_first_few(sorted(known))}): every reward would be "
            f"evalkit.unsupported_score; check evalkit.path and data.task_list",
        )
    detail = f"{len(tasks) - len(unknown)} of {len(tasks)} dataset tasks have an evaluator"
    if unknown:
        detail += (
            f"; {len(unknown)} score evalkit.unsupported_score = {cfg.evalkit.unsupported_score}: {', '.join(unknown)}"
        )
    return Check("evalkit_tasks", True, detail)


def _first_few(names: list[str], shown: int = 3) -> str:
    """The first `shown` names, and how many more: enough to tell two task lists apart in one line."""
    if not names:
        return "none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_judge_rubrics(cfg: Config, dataset_dir: Path) -> Check:
    """The pinned rubric source covers every task of the dataset, and the pinned protocol source reads (vbvr_vlm)."""
    from videogrpo.errors import VideoGRPOError
    from videogrpo.rewards.judge_protocol import load_protocol, load_rubrics

    tasks = sorted({entry["task"] for entry in json.loads((dataset_dir / "splits.json").read_text())})
    try:
        rubrics = load_rubrics(cfg.reward.judge_prompts, cfg.reward.judge_prompts_digest, tasks)
        load_protocol(cfg.reward.judge_protocol, cfg.reward.judge_protocol_digest)
    except VideoGRPOError as err:
        return Check("judge_rubrics", False, str(err))
    return Check(
        "judge_rubrics",
        True,
        f"{cfg.reward.judge_prompts}: rubrics for all {len(tasks)} tasks "
        f"({len(rubrics)} in the source), SHA-256 = reward.judge_prompts_digest; "
        f"{cfg.reward.judge_protocol}: the judge protocol's two texts, SHA-256 = reward.judge_protocol_digest",
    )


def check_judge_endpoint(cfg: Config) -> Check:
    """The existing judge service reward.judge_endpoint names answers and serves reward.judge_served_name, asked as
    training asks it (judge_service.reach_or_note): a dead endpoint fails here once, not in every try of the
    training job after its GPUs are allocated; where only a gold reward needs the judge, it is a warning (training
    goes on without the judge's numbers at validation), as it is when training starts."""
    from videogrpo.errors import VideoGRPOError
    from videogrpo.rewards.judge_service import reach_or_note

    try:
        endpoint, note = reach_or_note(cfg)
    except VideoGRPOError as err:
        return Check("judge_endpoint", False, str(err))
    return Check("judge_endpoint", True, note or f"{endpoint} serves {cfg.reward.judge_served_name!r}")


def reward_checks(cfg: Config, evalkit_fingerprint: Path | None, dataset_dir: Path) -> list[Check]:
    """The checks of every reward the run scores with (config.reward_kinds): the EvalKit's for the rule reward, the
    judge's pinned sources for the VLM judge, and its service where reward.judge_endpoint names one (a service the
    training job starts on each node does not run yet); a run of several rewards (reward.terms) checks each of them."""
    kinds = reward_kinds(cfg)
    found = []
    if "vbvr_rule" in kinds:
        found += [check_evalkit(cfg, evalkit_fingerprint), check_evalkit_tasks(cfg, dataset_dir)]
    if "vbvr_vlm" in kinds:
        found.append(check_judge_rubrics(cfg, dataset_dir))
        if cfg.reward.judge_endpoint:
            found.append(check_judge_endpoint(cfg))
    return found


def check_dataset(validation_file: Path, dataset_dir: Path, prompts_per_step: int) -> Check:
    report = json.loads(validation_file.read_text())
    splits = json.loads((dataset_dir / "splits.json").read_text())
    train = sum(len(entry["rl"]) for entry in splits)
    if train < prompts_per_step:
        return Check(
            "dataset",
            False,
            f"{dataset_dir}: {train} training samples, fewer than grpo.prompts_per_step "
            f"= {prompts_per_step}; lower it or add data",
        )
    return Check(
        "dataset",
        True,
        f"{report['samples']} samples validated, {train} for training, "
        f"{sum(len(e['heldout']) for e in splits)} held out",
    )


def transformer_parameters(model_dir: Path, transformers: tuple[str, ...] = ("transformer",)) -> int:
    """Parameter count of the trained transformers (both experts' of a two-expert run), read from their
    safetensors headers (no weights loaded); WeightsError names a damaged or missing weights file."""
    return sum(sum(directory_numels(model_dir / name).values()) for name in transformers)


def check_disk_space(cfg: Config, model_dir: Path, run_dir: Path) -> Check:
    """Room for the checkpoints kept (train.keep_checkpoints, plus the one being written) and the export.

    A checkpoint holds float32 weights and two float32 AdamW moments: 12 bytes per parameter of every trained
    expert.
    """
    import shutil

    from videogrpo.progress import human_bytes

    try:
        params = transformer_parameters(model_dir, trained_transformers(cfg))
    except WeightsError as err:
        return Check("disk_space", False, f"cannot size the checkpoints: {err}")
    need = params * 12 * (cfg.train.keep_checkpoints + 1) + params * 4
    run_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run_dir).free
    detail = (
        f"{run_dir}: {human_bytes(free)} free; {cfg.train.keep_checkpoints} + 1 checkpoints of {params:,} "
        f"parameters and the export need {human_bytes(need)}"
    )
    if free < need:
        return Check("disk_space", False, detail + "; free space, lower train.keep_checkpoints, or move results")
    return Check("disk_space", True, detail)


def check_memory_plan(
    cfg: Config, model_dir: Path, frozen_dtype: str | None = None, probe=None, meminfo: Path = Path("/proc/meminfo")
) -> tuple[Check, dict]:
    """The per-rank memory plan (memory_plan.py) against the device, and the plan itself for the report.

    On CUDA the run is refused when the plan's peak exceeds the device's memory less the co-hosted judge's share,
    or, with parallel.offload_optimizer, when procs_per_node ranks' host terms and a reserve exceed this node's
    MemTotal; on CPU it is printed only. `frozen_dtype` overrides model.frozen_dtype; `probe`: torch.cuda's
    stand-in; `meminfo`: /proc/meminfo's.
    """
    from videogrpo.preflight import memory_plan, model_shape

    try:
        shape = model_shape.ModelShape.from_model_dir(model_dir, trained_transformers(cfg))
        plan = memory_plan.plan_for_config(cfg, shape, frozen_dtype, probe)
    except WeightsError as err:  # names the file, the tensor and the fix
        return Check("memory_plan", False, f"cannot plan memory: {err}"), {}
    except (OSError, KeyError, ValueError) as err:  # an unreadable config; other checks name the cause
        return Check("memory_plan", False, f"{model_dir}: cannot plan memory ({type(err).__name__}: {err})"), {}
    lines = "\n    " + "\n    ".join(plan.lines())
    if plan.enforced and plan.device_bytes is None:
        detail = (
            f"{plan.device_source}, so the plan cannot be checked: set parallel.device_memory_gib to the GPUs' "
            f"memory (e.g. 80 for an H100) or run preflight on a GPU node{lines}"
        )
        return Check("memory_plan", False, detail), plan.as_dict()
    if not plan.fits:
        detail = (
            f"the plan needs {memory_plan.gib(plan.peak)} per rank, more than the {memory_plan.gib(plan.available)} "
            f"available; shard more (parallel.data_parallel, shard_group_size, nodes), roll out fewer rows at once "
            f"(grpo.prompts_per_wave), lower video.* or reward.judge_gpu_memory, or correct "
            f"parallel.device_memory_gib{lines}"
        )
        return Check("memory_plan", False, detail), plan.as_dict()
    if plan.enforced and plan.host_terms and (refused := host_memory_problem(cfg, plan, meminfo)):
        return Check("memory_plan", False, refused + lines), plan.as_dict()
    verdict = "fits" if plan.enforced else "not enforced on CPU"
    if not cfg.has_actors:
        return Check("memory_plan", True, f"{memory_plan.gib(plan.peak)} per rank, {verdict}{lines}"), plan.as_dict()
    from videogrpo.preflight.actor_memory import actor_plan

    actor = actor_plan(cfg, shape, frozen_dtype, probe)
    both = f"{lines}\n  a rollout actor:\n    " + "\n    ".join(actor.lines())
    report = dict(plan.as_dict(), actor=actor.as_dict())
    if not actor.fits:
        detail = (
            f"a rollout actor needs {memory_plan.gib(actor.peak)}, more than the {memory_plan.gib(actor.available)} "
            f"available (it holds the policy whole); roll out fewer rows at once (grpo.sample_batch_size, "
            f"grpo.decode_batch_size), or train without actors (actors.train_ranks 0){both}"
        )
        return Check("memory_plan", False, detail), report
    sizes = f"{memory_plan.gib(plan.peak)} per train rank, {memory_plan.gib(actor.peak)} per actor"
    return Check("memory_plan", True, f"{sizes}, {verdict}{both}"), report


HOST_RESERVE_GIB = 16
"""Host memory the plan leaves to everything it does not count: the OS and page cache, each process's Python, CUDA
and NCCL host state, the data loader, parked trajectories and the prompt cache."""


def host_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemTotal of this node in bytes (None where there is no /proc/meminfo)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def host_memory_problem(cfg: Config, plan, meminfo: Path) -> str | None:
    """Why the node's host memory cannot hold procs_per_node ranks' offloaded state (None: it can, or unknown)."""
    from videogrpo.preflight.memory_plan import GIB, gib

    total = host_memory_bytes(meminfo)
    if total is None:
        return None
    procs = cfg.parallel.procs_per_node
    need = procs * plan.host_bytes + HOST_RESERVE_GIB * GIB
    if need <= total:
        return None
    return (
        f"parallel.offload_optimizer = true: {procs} ranks per node (parallel.procs_per_node) x "
        f"{gib(plan.host_bytes)} of host memory each + a {HOST_RESERVE_GIB} GiB reserve = {gib(need)}, more than "
        f"this node's {gib(total)} (MemTotal, {meminfo}); shard more (parallel.data_parallel, shard_group_size, "
        f"nodes), or set parallel.offload_optimizer and parallel.offload_gradients to false"
    )


def check_video_io() -> Check:
    import numpy as np

    from videogrpo.data.video import read_video, write_mp4

    frames = np.random.default_rng(0).integers(0, 255, (5, 32, 32, 3), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.mp4"
        try:
            write_mp4(path, frames, fps=16)
            back = read_video(path)
        except Exception as err:  # any codec failure is the finding
            return Check("video_io", False, f"H.264 encode/decode with PyAV failed: {err}; reinstall av")
    ok = back.shape == frames.shape
    return Check("video_io", ok, f"H.264 round trip gave {back.shape}, expected {frames.shape}")


def check_attention_backend(name: str) -> Check:
    if name == "native":  # diffusers' default, known to every release and needing no package: importing diffusers to
        return Check("attention_backend", True, "native available")  # ask costs a node launcher seconds of CPU
    from diffusers.models.attention_dispatch import AttentionBackendName

    known = {b.value for b in AttentionBackendName}
    if name not in known:
        return Check(
            "attention_backend",
            False,
            f"parallel.attention_backend = {name!r}: unknown to diffusers; known: {sorted(known)}",
        )
    package = BACKEND_PACKAGES.get(name)
    if package and importlib.util.find_spec(package) is None:
        return Check(
            "attention_backend",
            False,
            f"parallel.attention_backend = {name!r} needs the {package!r} "
            f"package, which is not installed here; install it or use 'native'",
        )
    return Check("attention_backend", True, f"{name} available")


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def check_attention_kernel(cfg: Config, cache: Path | None, manifest: Path | None) -> Check:
    """The Hub kernel cache holds the pinned revision, every file as fetch_kernel recorded it, the ref the installed
    diffusers asks for names it, and huggingface_hub's offline lookup (the one `kernels` makes) finds it."""
    from videogrpo.artifacts import attention_kernel as ak
    from videogrpo.errors import VideoGRPOError
    from videogrpo.provenance.manifest import read_manifest

    p = cfg.parallel
    if cache is None or manifest is None:
        return Check(
            "attention_kernel",
            False,
            f"parallel.attention_backend = {p.attention_backend!r} loads a Hub kernel: give --kernel-cache and "
            f"--kernel-manifest (fetch_kernel's; the workflow does)",
        )
    try:
        if why := ak.registry_problem(p.attention_backend, p.attention_kernel_repo, p.attention_kernel_revision):
            return Check("attention_kernel", False, why)
        problems = ak.cache_problems(
            cache, read_manifest(manifest), p.attention_kernel_repo, p.attention_kernel_revision
        )
    except VideoGRPOError as err:
        return Check("attention_kernel", False, str(err))
    if problems:
        return Check("attention_kernel", False, f"{cache}: " + "; ".join(problems))
    _, _, version = ak.registry_entry(p.attention_backend)
    try:
        found = ak.offline_snapshot(
            cache, p.attention_kernel_repo, version, p.attention_kernel_revision if version is None else None
        )
    except Exception as err:  # huggingface_hub's LocalEntryNotFoundError, a missing ref
        return Check(
            "attention_kernel",
            False,
            f"{cache}: offline lookup failed ({err}); the installed diffusers asks for version {version}: rerun "
            f"fetch_kernel (snakemake --forcerun fetch_kernel)",
        )
    want = ak.snapshot_dir(cache, p.attention_kernel_repo, p.attention_kernel_revision)
    if found.resolve() != want.resolve():
        return Check(
            "attention_kernel",
            False,
            f"{cache}: version {version} resolves offline to {found}, not {want}; rerun fetch_kernel",
        )
    variants, chosen = ak.build_variants(want)
    cuda = cfg.parallel.device == "cuda" and _cuda_visible()
    ok, loads = ak.variant_verdict(variants, chosen, ak.kernels_installed(), cuda)
    if not ok:
        return Check("attention_kernel", False, f"{want}: {loads}")
    return Check(
        "attention_kernel",
        True,
        f"{p.attention_kernel_repo}@{p.attention_kernel_revision}: every file as fetch_kernel recorded it, found "
        f"offline{'' if version is None else f' through refs/v{version}'}; {len(variants)} build variants; {loads}",
    )


def check_port_free(port: int, host: str = "") -> Check:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            return Check(
                "rendezvous_port",
                False,
                f"port {port} on {socket.gethostname()} is in use ({err}); set parallel.master_port to a free port",
            )
    return Check("rendezvous_port", True, f"port {port} free on {socket.gethostname()}")


def node_checks(
    cfg: Config, port: int | None = None, devices: int | None = None, facts: node_preflight.NodeFacts | None = None
) -> list[Check]:
    """The checks that must hold on every machine of the job (node_preflight.py), from `facts` or a fresh probe.

    devices: how many CUDA devices this process needs (parallel.procs_per_node unless given).
    """
    if facts is None:
        env = dict(os.environ, **node_preflight.node_env(dict(os.environ)))
        facts = node_preflight.probe(cfg.parallel.device, env)
    p = cfg.parallel
    needed = p.procs_per_node if devices is None else devices
    checks = node_preflight.decide(facts, p.device, p.backend, p.attention_backend, needed)
    checks.append(check_attention_backend(p.attention_backend))
    if port is not None:
        checks.append(check_port_free(port))
    return checks


def as_report(checks: list[Check]) -> dict:
    return {"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}
