# The config, every path of the workflow and the small input functions its rules share; the logic they call lives in
# the package (videogrpo.pipeline), where tests and linters reach it. Reading this file writes nothing (a dry run
# changes nothing on disk): what a run writes before its first job, `onstart` does. Imports only light modules of
# the package: a dry run must not pay for torch or diffusers.
import json
import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.common import get_container_image
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from videogrpo import config as vg
from videogrpo import models
from videogrpo.artifacts import attention_kernel
from videogrpo.config.retired import retired_in_layers
from videogrpo.errors import VideoGRPOError
from videogrpo.launch import k8s_job
from videogrpo.pipeline import (
    driver_interrupt,
    driver_lock,
    job_error_lines,
    layout,
    object_storage,
    start,
    start_check,
    unstarted_jobs,
)
from videogrpo.pipeline.resources import job_resources
from videogrpo.pipeline.stage_config import code_param, config_path, rule_params
from videogrpo.provenance import digest_cache, interconnect
from videogrpo.provenance.digest import list_files
from videogrpo.stages import STAGES

# A lock a killed driver left: taken over when provably stale, else explained (pipeline/driver_lock.py).
driver_lock.install()
# A job that failed before it started (its submission refused, the scheduler down) keeps the outputs it never touched
# (pipeline/unstarted_jobs.py); Snakemake removes a failed job's outputs otherwise.
unstarted_jobs.install()
# A failed job is shown without Snakemake's `message: None` line (pipeline/job_error_lines.py).
job_error_lines.install()
# A second Ctrl-C while Snakemake waits for the jobs it stopped is ignored by the driver, not shown as Snakemake's
# tracebacks (pipeline/driver_interrupt.py).
driver_interrupt.install()
# A field that is gone is refused naming the file (or --config) that still gives it, and its new home.
if _gone := retired_in_layers(workflow.configfiles, workflow.config_settings.config):
    raise WorkflowError("fields that are gone:\n  - " + "\n  - ".join(_gone))
# Coerce (--config values arrive as strings), fill defaults and check every rule, naming the field.
CFG = vg.from_dict(config)
config.clear()
config.update(vg.to_dict(CFG))
validate(config, "../schemas/config.schema.json")
# Settings that run but leave an algorithm a shadow of itself: said once, by the driver (a dry run too).
if workflow.is_main_process:
    for _warning in vg.setting_warnings(CFG):
        print(f"warning: {_warning}", file=sys.stderr)
if "mlflow" in CFG.logging.tracker:  # before any job: the URI lives in the environment, which every job inherits
    from videogrpo.grpo import mlflow_run

    try:
        mlflow_run.tracking_uri()
    except VideoGRPOError as err:
        raise WorkflowError(str(err)) from None

TASK_LIST_TEXT = vg.read_task_list_text(CFG.data.task_list)
RUN_ID = vg.run_identity(CFG, TASK_LIST_TEXT)
# Object storage (docs/object-storage.md): under --default-storage-provider, Snakemake maps every input and
# output to the bucket and gives jobs local copies, so a file the checkout holds is marked local(), and what a
# stage reads beyond its declared files (the dataset's raw/, preflight's splits) is declared in that mode only:
# on a shared file system the DAG, and so what reruns, stays as it was.
OBJECT_STORAGE = workflow.storage_settings.default_storage_provider is not None
STORAGE_PREFIX = (workflow.storage_settings.default_storage_prefix or "").rstrip("/")


def storage_endpoint():
    """The S3 endpoint Snakemake's plugin uses (--storage-s3-endpoint-url or SNAKEMAKE_STORAGE_S3_ENDPOINT_URL),
    for the training stage's checkpoint mirror; None for AWS itself. Never credentials: those stay in the
    environment."""
    tagged = (workflow.storage_provider_settings or {}).get("s3")
    settings = tagged.get_settings() if tagged is not None else None
    return getattr(settings, "endpoint_url", None)


if (
    OBJECT_STORAGE and workflow.is_main_process
):  # what Snakemake's S3 plugin has not refused by now, one line each (pipeline/object_storage.py)
    _s3 = (workflow.storage_provider_settings or {}).get("s3")
    _s3 = _s3.get_settings() if _s3 is not None else None
    if _found := object_storage.problems(
        STORAGE_PREFIX, storage_endpoint(), getattr(_s3, "access_key", None), getattr(_s3, "secret_key", None)
    ):
        raise WorkflowError("\n".join(_found))

RESULTS = CFG.results
# A results path through a file cannot even be looked at; a read-only tree is no reason to refuse a dry run, which
# writes nothing: said here (a dry run shows it too), refused when a run starts (onstart).
if (_problem := layout.results_problem(RESULTS, writing=False)) is not None:
    raise WorkflowError(_problem)
if workflow.is_main_process and (_problem := layout.results_problem(RESULTS)) is not None:
    print(f"warning: {_problem}\n(a dry run reads only; a run stops before its first job)", file=sys.stderr)
RUN = f"{RESULTS}/runs/{RUN_ID}"
MODEL = f"{RESULTS}/models/{layout.model_key(CFG)}"
DATA = f"{RESULTS}/data/{layout.data_key(CFG, TASK_LIST_TEXT)}"
# Keyed by the pinned digest, not by where the checkout lives: a moved copy reruns nothing. A missing or edited one
# (a typo in evalkit.path) is said here, so that a dry run shows it too, and refused before any job that reads it.
EVALKIT = f"{RESULTS}/evalkit/{layout.evalkit_key(CFG)}"
if workflow.is_main_process and (_kit := start_check.evalkit_problem(CFG.evalkit.path, CFG.evalkit.digest)):
    print(f"warning: {_kit}\n(a run stops before any job that reads the EvalKit)", file=sys.stderr)
# The reward kinds the run scores with (reward.terms' kinds, or reward.kind alone): each one's runtime is started
# and checked.
RULE_REWARD = "vbvr_rule" in vg.reward_kinds(CFG)
# The VLM judge: a per-node service the training job starts from the pinned judge model, unless
# reward.judge_endpoint names a service that already runs.
JUDGE_SERVICE = "vbvr_vlm" in vg.reward_kinds(CFG) and not CFG.reward.judge_endpoint
JUDGE = f"{RESULTS}/models/{layout.judge_key(CFG)}"
# The prompt refiners (the `refiners` section): each one's download, by its name; refiners of one download share it.
REFINERS = {e.name: f"{RESULTS}/models/refiners/{layout.refiner_key(e)}" for e in CFG.refiners.experts}
REFINER_DOWNLOADS = {layout.refiner_key(e): layout.refiner_download(e) for e in CFG.refiners.experts}
# The Hub kernel of a `*_hub` attention backend: fetched into its own cache, which training loads offline.
HUB_KERNEL = vg.uses_hub_kernel(CFG)
KERNEL = f"{RESULTS}/kernels/{layout.kernel_key(CFG)}"
KERNEL_CACHE = f"{KERNEL}/cache"

# The evaluation matrix: cells keyed by model and sampler under a directory of the evaluation set and the
# generation settings, so base and hub-model cells are shared by runs and other settings never overwrite. Every run
# has one: at least its held-out check (the trained and base model under the training sampler, config/cells.py).
EVALSET = f"{RESULTS}/evalsets/{layout.evalset_key(CFG, TASK_LIST_TEXT)}"
# The run's one evaluation set: the external tree, or the tree eval_set builds from the dataset's matrix.split.
EVAL_TREE = CFG.matrix.eval_set or f"{EVALSET}/tree"
MATRIX = f"{RESULTS}/matrix/{layout.matrix_key(CFG, TASK_LIST_TEXT)}"
CELL = f"{MATRIX}/{{model}}/{{sampler}}"
if CFG.matrix.eval_set and not (Path(CFG.matrix.eval_set) / "split_manifest.json").is_file():
    # A dry run may plan the matrix before the tree is there; the eval_set job refuses it, naming the field.
    print(
        f"warning: matrix.eval_set = {CFG.matrix.eval_set!r} holds no split_manifest.json (yet): the eval_set job "
        f"will refuse it until the release evaluation tree is there",
        file=sys.stderr,
    )
CELL_MODELS = layout.cell_models(CFG, RUN_ID)
CELL_KINDS = {cell: name if name in vg.RUN_MODELS else "hub" for name, cell in CELL_MODELS.items()}
HUB_SPECS = {layout.hub_model_key(name, spec): spec for name, spec in CFG.matrix.hub_models.items()}
MATRIX_TABLE = f"{RUN}/matrix/matrix.csv"

# profiles/kubernetes sets the default resource `videogrpo_kubernetes`: GPU jobs then ask for the executor
# plugin's `gpu` (the profile gives `gpu_manufacturer`), and multi-node training, which the plugin cannot run (one
# pod per job), becomes one indexed Job that the train rule writes, applies and waits for on the driver (k8s_job.py).
KUBERNETES = any(
    arg.split("=")[0] == "videogrpo_kubernetes"
    for arg in getattr(workflow.resource_settings.default_resources, "args", None) or []
)
K8S_TRAIN_JOB = KUBERNETES and k8s_job.trains_as_job(CFG)
if K8S_TRAIN_JOB and not workflow.remote_exec and k8s_job.problems(CFG, os.getcwd()):
    raise WorkflowError(
        f"profiles/kubernetes: parallel.nodes = {CFG.parallel.nodes} trains as one indexed Job, which cannot run "
        f"here:\n  - " + "\n  - ".join(k8s_job.problems(CFG, os.getcwd()))
    )

if KUBERNETES and "mlflow" in CFG.logging.tracker:
    # A plugin pod gets only the driver's variables the workflow names (the plugin hands them over as a Secret).
    workflow.register_envvars(*(name for name in mlflow_run.ENVIRONMENT if name in os.environ))


onstart:
    # A real run (never a dry run, never a job's own process), its DAG built, no output removed yet.
    driver_lock.record_workflow_driver(workflow)  # who holds the lock Snakemake just took
    # The executor's settings are known only now (after the Snakefile was read): refuse before any pod starts.
    found = k8s_job.settings_problems(
        CFG,
        workflow.executor_plugin.name,
        KUBERNETES,
        workflow.remote_execution_settings.container_image,
        get_container_image(),
    )
    if found:
        raise WorkflowError("profiles/kubernetes:\n  - " + "\n  - ".join(found))
    if problem := layout.results_problem(RESULTS):
        raise WorkflowError(problem)
    if problem := unstarted_jobs.scheduler_problem(workflow.executor_plugin.name, workflow.dag.needrun_jobs()):
        raise WorkflowError(problem)
    unstarted_jobs.record(workflow.dag.needrun_jobs())
    jobs = start.stage_jobs(
        workflow.dag.needrun_jobs(),
        STAGES,
        UNDECLARED_READS,
        UNDECLARED_WRITES,
        EVALKIT_READERS,
        (CFG.evalkit.path, CFG.evalkit.digest),
        PINNED_INPUTS,
        (EVAL_TREE, CFG.matrix.eval_set_digest) if CFG.matrix.eval_set else None,
    )
    try:
        start.begin_run(
            CFG,
            RESULTS,
            RUN_ID,
            RUN_MANIFESTS,
            workflow.configfiles,
            workflow.config_settings.config,
            jobs,
            OBJECT_STORAGE,
        )
    except VideoGRPOError as err:
        raise WorkflowError(str(err)) from None


# Resubmissions of a failed training job by Snakemake: a multi-node Job restarts its own pods instead.
TRAIN_RETRIES = 0 if K8S_TRAIN_JOB else CFG.train.retries

MODEL_DIR = f"{MODEL}/pipeline"
ARCHIVES = f"{DATA}/archives"
DATASET = f"{DATA}/materialized"
REPORT_HTML = f"{RUN}/report/report.html"


def stage_params(stage):
    """The contract and evaluation fields a stage reads, one param each (pipeline/stage_config.py)."""
    return rule_params(CFG, stage)


def stage_config(stage):
    """What a stage command receives (`--config-json @file`): every config field it reads, in the file `onstart`
    writes (pipeline/stage_config.py). Only its path here: reading the workflow writes nothing."""
    return f"@{config_path(RESULTS, CFG, stage)}"


def code(stage):
    """The code identity of what the stage runs: a param, since Snakemake does not see imported code."""
    return code_param(CFG, stage)


def cluster_resources(kind):
    """The cluster resources of a job of this kind that the recipe fixes (pipeline/resources.py): SLURM's, or under
    profiles/kubernetes the executor plugin's. A site's sizing (partition, account, memory, runtime, CPUs, ...) is
    the profile's: its default-resources and set-resources, which Snakemake lays over these."""
    return job_resources(CFG, kind, KUBERNETES)


def job_workers(wildcards, resources):
    """A CPU job's `--workers`: the cores the profile gives it (cpus_per_task), else 0, which the stage reads as
    every core it may use (a local run)."""
    return resources.get("cpus_per_task") or 0


def object_storage_only(**named):
    """Inputs or outputs declared only when the run's files live in object storage (see OBJECT_STORAGE)."""
    return named if OBJECT_STORAGE else {}


# The dataset's files beside dataset.json that stages read from its directory.
DATASET_PARTS = {
    "splits": f"{DATASET}/splits.json",
    "materialization": f"{DATASET}/materialization.json",
    "raw": f"{DATASET}/raw",
}


def dataset_inputs(*names):
    """DATASET_PARTS a stage reads, declared in object storage only (where the directory holds nothing but declared
    local copies)."""
    return object_storage_only(**{name: DATASET_PARTS[name] for name in names})


def checkpoint_store_args(wildcards, output):
    """train's --checkpoint-store: the bucket folder of the run's checkpoints (object_store.py), which a killed
    job's rerun on any node resumes from; nothing on a shared file system."""
    if not OBJECT_STORAGE:
        return ""
    endpoint = storage_endpoint()
    store = f"--checkpoint-store {shlex.quote(f'{STORAGE_PREFIX}/{RUN}/checkpoints')}"
    return store + (f" --checkpoint-store-endpoint {shlex.quote(endpoint)}" if endpoint else "")


def synthetic_inputs(**named):
    """Inputs only the synthetic dataset generator reads."""
    return named if CFG.data.source == "synthetic" else {}


def judge_service_inputs(**named):
    """Inputs that exist only when the training job starts its own judge service."""
    return named if JUDGE_SERVICE else {}


def export_outputs():
    """train's exports beside final/: best/, the weights of the best validation point by a gold reward
    (train.keep_best_by), and ema/, the moving average of the trained weights (train.ema_decay)."""
    named = {"best": directory(f"{RUN}/train/best")} if CFG.train.keep_best_by else {}
    return named | ({"ema": directory(f"{RUN}/train/ema")} if CFG.train.ema_decay is not None else {})


def hub_kernel_inputs(**named):
    """Inputs that exist only when the attention backend loads a Hub kernel (fetch_kernel's cache)."""
    return named if HUB_KERNEL else {}


def kernel_env(wildcards, input):
    """The shell prefix of a stage that sets the attention backend (diffusers loads the Hub kernel then): the
    kernel from fetch_kernel's cache, offline; nothing for a backend without a Hub kernel."""
    if not HUB_KERNEL:
        return ""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in attention_kernel.loader_env(input.kernel).items())


def rule_reward_inputs(**named):
    """Inputs that exist only when the reward is the EvalKit's rule reward."""
    return named if RULE_REWARD else {}


# The EvalKit's records. Evaluation (score_cell) scores with the EvalKit whatever reward.kind (the
# release evaluation, docs/reference-system.md#evaluation), so they are always in the DAG; preflight and training read them
# only for the rule reward (RULE_REWARD_STAGES).
EVALKIT_STAGES = ("fingerprint_evalkit", "check_scorer_runtime")
RULE_REWARD_STAGES = EVALKIT_STAGES if RULE_REWARD else ()
STAGE_MANIFESTS = {
    "fetch_model": f"{MODEL}/fetch_model.manifest.json",
    **{f"fetch_refiner:{name}": f"{folder}/fetch_refiner.manifest.json" for name, folder in REFINERS.items()},
    **judge_service_inputs(fetch_judge=f"{JUDGE}/fetch_judge.manifest.json"),
    **hub_kernel_inputs(fetch_kernel=f"{KERNEL}/fetch_kernel.manifest.json"),
    "fetch_dataset": f"{DATA}/fetch_dataset.manifest.json",
    "materialize_dataset": f"{DATA}/materialize_dataset.manifest.json",
    "validate_dataset": f"{DATA}/validate_dataset.manifest.json",
    "fingerprint_evalkit": f"{EVALKIT}/fingerprint_evalkit.manifest.json",
    "check_scorer_runtime": f"{EVALKIT}/check_scorer_runtime.manifest.json",
    "preflight": f"{RUN}/preflight.manifest.json",
    "train": f"{RUN}/train.manifest.json",
}


def matrix_jobs():
    """(key, manifest, wildcards) of every job the run's matrix adds, keyed by `stage` or `stage:model:sampler`: the
    report's provenance and RO-Crate include every cell, and the default target every output of each."""
    yield "eval_set", f"{EVALSET}/eval_set.manifest.json", {}
    for name, spec in CFG.matrix.hub_models.items():
        if name in CFG.matrix.models:
            key = layout.hub_model_key(name, spec)
            yield f"fetch_eval_model:{name}", f"{RESULTS}/models/eval/{key}/fetch_eval_model.manifest.json", {
                "hub": key
            }
    for name, sampler, cell in matrix_cells():
        wildcards = {"model": CELL_MODELS[name], "sampler": sampler}
        yield f"generate_cell:{name}:{sampler}", f"{cell}/generate_cell.manifest.json", wildcards
        yield f"score_cell:{name}:{sampler}", f"{cell}/score_cell.manifest.json", wildcards
    yield "matrix", f"{RUN}/matrix.manifest.json", {}


def directory_of_input(name):
    """A params function: the directory holding input `name` (not a hard-coded path prefix)."""
    return lambda wildcards, input: str(Path(input[name]).parent)


def directory_of_output(name):
    """A params function: the directory holding output `name`."""
    return lambda wildcards, output: str(Path(output[name]).parent)


def upstream(*stages):
    """Named inputs: the manifests of the stages whose outputs a rule reads. The stage checks each input
    against them (`--upstream`) and fails, naming the file and both digests, when one was changed."""
    return {f"{stage}_manifest": STAGE_MANIFESTS[stage] for stage in stages if stage in STAGE_MANIFESTS}


def refiner_inputs():
    """The train rule's inputs of the prompt refiners: each download by name, with its manifest (--upstream)."""
    found = {}
    for name, folder in REFINERS.items():
        found[f"refiner_{name}"] = f"{folder}/model"
        found[f"fetch_refiner_{name}_manifest"] = f"{folder}/fetch_refiner.manifest.json"
    return found


def refiner_args(wildcards, input):
    """The train stage's --refiner NAME=DIR arguments (a params function)."""
    return " ".join(f"--refiner {name}={input[f'refiner_{name}']}" for name in REFINERS)


def refiner_download_json(wildcards):
    """What fetch_refiner fetches for the download `wildcards.refiner` (its param: a change fetches again)."""
    return json.dumps(REFINER_DOWNLOADS[wildcards.refiner], sort_keys=True)


def refiner_code(wildcards):
    """fetch_refiner's code identity: a pinned snapshot runs no code that shapes its bytes; the tiny one is its
    builder's."""
    if REFINER_DOWNLOADS[wildcards.refiner]["source"] == "hub":
        return "pinned Hub snapshot"
    return code("fetch_refiner")


def upstream_args(wildcards, input):
    """The `--upstream` arguments of a rule's manifest inputs (a params function)."""
    return " ".join(f"--upstream {path}" for name, path in input.items() if name.endswith("_manifest"))


def train_job_submit(wildcards, resources):
    """The train rule's command prefix (a params function: the executor's settings are there only once the DAG is
    built): under profiles/kubernetes with several nodes, `videogrpo stage k8s-job`, which writes the run's Job
    beside it (`k8s/train-job.yaml`), applies it and waits; every pod runs the training command that follows `--`.
    Its pods run as the executor plugin's do (its image, namespace, service account, privileged mode) and are sized
    by the rule's resources. Elsewhere nothing: the rule runs the training command itself."""
    if not K8S_TRAIN_JOB:
        return ""
    image = workflow.remote_execution_settings.container_image
    args = k8s_job.pod_arguments(image, workflow.executor_settings, resources)
    spec = f"{RUN}/k8s/train-job.yaml"
    return (
        f"videogrpo stage k8s-job --config-json {shlex.quote(stage_config('train'))} --run-id {RUN_ID}"
        f" --spec {shlex.quote(spec)} {shlex.join(args)} --apply -- "
    )


def interconnect_args(wildcards, resources):
    """train's --interconnect-env: the NCCL and EFA settings of the profile (the train rule's `interconnect_env`
    resource, docs/options.md#interconnect-settings), which the stage hands to every node's workers. Environment, not
    config: they change how tensors travel, not what training computes, so they are no part of the run identity,
    and a params function of `resources` is no rerun trigger for Snakemake. Checked here, so a dry run refuses a bad
    one too."""
    value = resources.get(interconnect.RESOURCE) or ""
    try:
        interconnect.parse(value, f"set-resources: train: {interconnect.RESOURCE} of your profile")
    except VideoGRPOError as err:
        raise WorkflowError(str(err)) from None
    return f"--interconnect-env {shlex.quote(value)}" if value else ""


def eval_tree_inputs():
    """eval_set's inputs: the materialized dataset it builds the set from (its index and split manifest, checked
    against materialize_dataset's manifest), or every file of the external tree its digest covers (so that an edit
    reruns the check, which then refuses it); nothing while the external tree is absent (dry runs). Listed at every
    parse, so by the digest's own scandir walk: half the time of pathlib's rglob and a stat per path."""
    if not CFG.matrix.eval_set:
        return {
            "index": f"{DATASET}/dataset.json",
            **upstream("materialize_dataset"),
            **dataset_inputs("splits", "raw"),
        }
    root = Path(EVAL_TREE)
    if not (root / "split_manifest.json").is_file():
        return {}
    return {"tree_files": [local(str(root / rel)) for rel in list_files(root)]}


def eval_set_outputs():
    """eval_set's outputs beyond the list and the final frames: the tree it builds from the dataset (an external
    tree is an input, pinned)."""
    return {} if CFG.matrix.eval_set else {"tree": directory(EVAL_TREE)}


def built_tree_inputs():
    """The evaluation tree eval_set built, for the cells that read it, declared in object storage only (where a job
    reads nothing but declared local copies); an external tree is read where it is."""
    return object_storage_only(tree=EVAL_TREE) if not CFG.matrix.eval_set else {}


def eval_set_source(wildcards, input, output):
    """eval_set's source arguments: the external tree where it is, or the dataset (by its input, a local copy in
    object storage) and the tree to build."""
    if CFG.matrix.eval_set:
        return f"--tree {shlex.quote(EVAL_TREE)}"
    return f"--dataset {shlex.quote(str(Path(input.index).parent))} --out-tree {shlex.quote(output.tree)}"


def cell_model_inputs(wildcards):
    """generate_cell's model inputs for the `model` wildcard: the pipeline directory, the trained transformer,
    and the manifests that vouch for them."""
    kind = CELL_KINDS.get(wildcards.model)
    if kind is None:
        raise WorkflowError(f"matrix: {wildcards.model} is none of this configuration's models {sorted(CELL_KINDS)}")
    if kind == "hub":
        root = f"{RESULTS}/models/eval/{wildcards.model}"
        return {"model": f"{root}/pipeline", "fetch_eval_model_manifest": f"{root}/fetch_eval_model.manifest.json"}
    named = {"model": MODEL_DIR, **upstream("fetch_model")}
    if kind != "base":  # best, ema: train's exports beside final/ (train.keep_best_by, train.ema_decay)
        export = kind if kind in ("best", "ema") else "final"  # the refiners' cells: the trained generator
        named.update(final=f"{RUN}/train/{export}", **upstream("train"))
    if kind == "base_refiners":  # the refiners the run started from: their downloads
        named.update(refiner_inputs())
    return named


def cell_refiner_args(wildcards, input):
    """generate_cell's prompt refiners (a params function): for `refined` the trained ones in final/refiners/, for
    `base_refiners` their downloads, with the refiners section (their sampling settings); nothing otherwise."""
    kind = CELL_KINDS.get(wildcards.model)
    if kind not in ("refined", "base_refiners"):
        return ""
    given = []
    for name in REFINERS:
        folder = f"{input.final}/refiners/{name}" if kind == "refined" else input[f"refiner_{name}"]
        given.append(f"--refiner {shlex.quote(f'{name}={folder}')}")
    settings = json.dumps(vg.to_dict(CFG)["refiners"], sort_keys=True)
    given.append(f"--refiners-json {shlex.quote(settings)}")
    return " ".join(given)


def model_files():
    """(files, manifests): the files of every model the run's matrix evaluates, by name (the base pipeline, the
    trained, best and EMA weights, a Hub model's pipeline), and the manifests of the stages that made them (named as
    upstream inputs). matrix and report check them before they present a model (a report over weights changed since
    is refused, naming the file), through the digest cache. On a shared file system only: in object storage a job
    reads declared local copies, and these are tens of GB."""
    if OBJECT_STORAGE:
        return {}, {}
    files, manifests = {}, set()
    for name, cell in CELL_MODELS.items():
        named = cell_model_inputs(SimpleNamespace(model=cell))
        files[name] = named.get("final", named["model"])
        if "final" in named:  # trained weights replace the base pipeline's transformer: the rest is the base's
            files.setdefault("base", named["model"])
        manifests |= {path for key, path in named.items() if key.endswith("_manifest")}
    return files, {f"model{i}_manifest": path for i, path in enumerate(sorted(manifests))}


def model_files_args(wildcards):
    """matrix's and report's --model-files and --digest-cache (a params function)."""
    files, _ = model_files()
    listed = " ".join(f"--model-files {shlex.quote(f'{name}={path}')}" for name, path in sorted(files.items()))
    return f"{listed} --digest-cache {shlex.quote(str(digest_cache.cache_path(RESULTS)))}" if listed else ""


def trained_transformer_arg(wildcards, input):
    """--transformer (and, for I2V-A14B, --transformer-2) of a trained cell: the folders of its final export
    that replace the base pipeline's (models.trained_folders); nothing for a pipeline evaluated as it is."""
    if "final" not in input.keys():
        return ""
    folders = models.trained_folders(CFG)
    return " ".join(f"--{name.replace('_', '-')} {Path(input.final) / name}" for name in folders)


def matrix_cells():
    """(name, sampler, cell directory) of every cell of this run's matrix: matrix.models x matrix.samplers and the
    held-out check's (vg.matrix_cells)."""
    return [(name, sampler, f"{MATRIX}/{CELL_MODELS[name]}/{sampler}") for name, sampler in vg.matrix_cells(CFG)]


def matrix_cell_inputs():
    named = {}
    for i, (name, sampler, cell) in enumerate(matrix_cells()):
        named[f"cell{i}_scores"] = f"{cell}/scores.csv"
        named[f"cell{i}_score_cell_manifest"] = f"{cell}/score_cell.manifest.json"
    return named


def matrix_cell_args(wildcards, input):
    return " ".join(
        f"--cell {name}:{sampler}={input[f'cell{i}_scores']}" for i, (name, sampler, _) in enumerate(matrix_cells())
    )


MATRIX_JOBS = list(matrix_jobs())
STAGE_MANIFESTS.update({key: manifest for key, manifest, _ in MATRIX_JOBS})
REPORT_MANIFEST = f"{RUN}/report.manifest.json"
# Every manifest of the run, the report's included (which reads all the others): what `videogrpo verify` expects.
RUN_MANIFESTS = {**STAGE_MANIFESTS, "report": REPORT_MANIFEST}


def every_stage_output(wildcards):
    """Every declared output of every stage job of the run (the target's input function: by then every rule is
    defined): each stage's outputs, with the job's wildcards (a matrix cell's model and sampler), so that a removed
    one is made again by a plain rerun."""
    of_job = {key: job_wildcards for key, _, job_wildcards in MATRIX_JOBS}
    of_job.update({f"fetch_refiner:{name}": {"refiner": Path(folder).name} for name, folder in REFINERS.items()})
    found = []
    for key in RUN_MANIFESTS:
        stage = workflow.get_rule(key.split(":")[0])
        for out in stage.expand_output(of_job.get(key, {}))[0]:
            # In object storage an output is its bucket object: the path as declared is its query less the prefix,
            # which Snakemake maps to the bucket again (as every other input of `all`).
            found.append(out.storage_object.query.removeprefix(f"{STORAGE_PREFIX}/") if out.is_storage else str(out))
    return found


# What the check at the start of a run covers beyond the rules' declared inputs (pipeline/start_check.py).
# The stages that read the EvalKit checkout: it must be at evalkit.digest before they start.
EVALKIT_READERS = {"fingerprint_evalkit", "check_scorer_runtime", "score_cell"} | ({"train"} if RULE_REWARD else set())
# Pinned as a whole (the EvalKit by evalkit.digest, an external tree by matrix.eval_set_digest): no stage made them.
PINNED_INPUTS = {"tree_files"}
# What a stage reads beyond its declared inputs on a shared file system (in object storage these are declared, see
# dataset_inputs and built_tree_inputs), with the manifests that vouch for them: the check still covers them.
_BUILT_TREE = {} if CFG.matrix.eval_set else {"tree": EVAL_TREE, **upstream("eval_set")}
UNDECLARED_READS = {
    **{
        stage: {**{name: DATASET_PARTS[name] for name in names}, **upstream("materialize_dataset")}
        for stage, names in {
            "validate_dataset": ("splits", "materialization", "raw"),
            "preflight": ("splits",),
            "train": ("splits", "raw"),
            **({} if CFG.matrix.eval_set else {"eval_set": ("splits", "raw")}),
        }.items()
    },
    "generate_cell": _BUILT_TREE,
    "score_cell": _BUILT_TREE,
    # The models matrix and report present (model_files): a run that would redo them over changed weights stops first.
    **{
        stage: {**{f"model:{n}": p for n, p in model_files()[0].items()}, **model_files()[1]}
        for stage in ("matrix", "report")
    },
}
# What a stage writes beyond its declared outputs on a shared file system: a run that reruns it remakes these, so
# they are not checked against its old manifest (in object storage raw/ is a declared output).
UNDECLARED_WRITES = {} if OBJECT_STORAGE else {"materialize_dataset": [DATASET_PARTS["raw"]]}
