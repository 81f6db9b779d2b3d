# Config resolution and every path of the workflow. Imports only the light config and digest modules
# of the package: a dry run must not pay for torch or diffusers.
import json
import os
import shlex
import sys
from types import SimpleNamespace
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from videogrpo import config as vg
from videogrpo import models
from videogrpo.pipeline import layout
from videogrpo import atomic
from videogrpo.artifacts import attention_kernel
from videogrpo.launch import k8s_job
from videogrpo.provenance.code import stage_code
from videogrpo.provenance.verify import stage_list
from videogrpo.provenance.digest import evalkit_files, sha256_bytes, sha256_file
from videogrpo.stages import STAGES

# Coerce (--config values arrive as strings), fill defaults and check every rule, naming the field.
CFG = vg.from_dict(config)
config.clear()
config.update(vg.to_dict(CFG))
validate(config, "../schemas/config.schema.json")
if "mlflow" in CFG.logging.tracker:  # before any job: the URI lives in the environment, which every job inherits
    from videogrpo.grpo import mlflow_run
    from videogrpo.errors import VideoGRPOError

    try:
        mlflow_run.tracking_uri()
    except VideoGRPOError as err:
        raise WorkflowError(str(err)) from None

TASK_LIST_TEXT = vg.read_task_list_text(CFG.data.task_list)
# How this workflow was invoked: the config files (with their digests) and the --config overrides as given.
INVOCATION = {
    "configfiles": [{"path": str(path), "sha256": sha256_file(path)} for path in workflow.configfiles],
    "config_overrides": dict(workflow.config_settings.config),
}
# The report records the invocation that made it, from a file of constant name (rewritten by every
# invocation), so that a new invocation alone reruns nothing.
INVOCATION_FILE = Path(CFG.results) / ".stage-config/invocation.json"
if "SLURM_JOB_ID" not in os.environ:  # a job step re-reads the workflow: the driver's invocation is the one
    try:  # even a dry run writes here (the stage config files): say which field to change, not a traceback
        atomic.write_json(INVOCATION_FILE, INVOCATION)
    except OSError as err:
        raise WorkflowError(
            f"results = {CFG.results!r}: cannot write {INVOCATION_FILE} ({type(err).__name__}: {err}); point "
            f"`results` at a writable directory, e.g. --config results=/scratch/$USER/videogrpo-results"
        ) from None
RUN_ID = vg.run_identity(CFG, TASK_LIST_TEXT)
# Object storage (README "Object storage"): under --default-storage-provider, Snakemake maps every input and
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


RESULTS = CFG.results
RUN = f"{RESULTS}/runs/{RUN_ID}"
MODEL = f"{RESULTS}/models/{layout.model_key(CFG)}"
DATA = f"{RESULTS}/data/{layout.data_key(CFG, TASK_LIST_TEXT)}"
# Keyed by the pinned digest and the checkout's path: an attempt with another path (a typo, a moved
# checkout) writes, and on failure deletes, its own outputs, never those of a good checkout.
EVALKIT = f"{RESULTS}/evalkit/{layout.evalkit_key(CFG)}"
RULE_REWARD = CFG.reward.kind == "vbvr_rule"
# The VLM judge: a per-node service the training job starts from the pinned judge model, unless
# reward.judge_endpoint names a service that already runs.
JUDGE_SERVICE = CFG.reward.kind == "vbvr_vlm" and not CFG.reward.judge_endpoint
JUDGE = f"{RESULTS}/models/{layout.judge_key(CFG)}"
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
CELL_KINDS = {cell: name if name in ("base", "trained") else "hub" for name, cell in CELL_MODELS.items()}
HUB_SPECS = {layout.hub_model_key(name, spec): spec for name, spec in CFG.matrix.hub_models.items()}
MATRIX_TABLE = f"{RUN}/matrix/matrix.csv"

# profiles/kubernetes sets the default resource `videogrpo_kubernetes`: GPU jobs then ask for the executor
# plugin's `gpu` and `gpu_manufacturer`, and multi-node training, which the plugin cannot run (one pod per job),
# becomes one indexed Job that the train rule writes, applies and waits for on the driver (k8s_job.py).
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
    # The executor's settings are known only now (after the Snakefile was read): refuse before any pod starts.
    found = k8s_job.settings_problems(
        CFG,
        workflow.executor_plugin.name,
        KUBERNETES,
        workflow.remote_execution_settings.container_image,
        getattr(workflow.executor_settings, "namespace", ""),
        getattr(workflow.executor_settings, "service_account_name", ""),
    )
    if found:
        raise WorkflowError("profiles/kubernetes:\n  - " + "\n  - ".join(found))


# Resubmissions of a failed training job by Snakemake: a multi-node Job restarts its own pods instead.
TRAIN_RETRIES = 0 if K8S_TRAIN_JOB else CFG.kubernetes.train_retries if KUBERNETES else CFG.slurm.train_retries

MODEL_DIR = f"{MODEL}/pipeline"
ARCHIVES = f"{DATA}/archives"
DATASET = f"{DATA}/materialized"
REPORT_HTML = f"{RUN}/report/report.html"


def stage_param_texts(stage):
    """The contract and evaluation fields a stage reads as `field=value` texts (vg.identity_fields)."""
    return {
        path.replace(".", "__"): f"{path}={json.dumps(value, sort_keys=True)}"
        for path, value in vg.identity_fields(vg.stage_view(CFG, stage)).items()
    }


def stage_params(stage):
    """The contract and evaluation fields a stage reads, one param each: a change reruns the stage, and
    `snakemake -n` names the field (`before: 'train.lr=0.0001' now: 'train.lr=0.0002'`). Execution fields
    (how it runs) and cosmetic ones are left out: a change reruns nothing complete.
    Snakemake expands {wildcards} in params strings, so a value holding braces (a command template) is
    given as a function, whose value is taken as it is."""
    return {
        key: (lambda wildcards, text=text: text) if "{" in text else text
        for key, text in stage_param_texts(stage).items()
    }


def stage_config(stage):
    """What a stage command receives (`--config-json @file`): every config field it reads, in a file named by
    a digest of its params. The name is a param, so changing a param reruns the stage; an execution field
    or a label changes the file in place, reruns nothing, and applies at the stage's next run."""
    name = sha256_bytes(vg.canonical_json(stage_param_texts(stage)).encode())[:16]
    path = Path(RESULTS) / ".stage-config" / f"{stage}-{name}.json"
    text = vg.canonical_json(vg.stage_view(CFG, stage))
    before = path.read_text() if path.is_file() else None
    if before != text:
        if before is not None and "SLURM_JOB_ID" not in os.environ:
            note_unapplied_fields(stage, before, text)
        atomic.write_text(path, text)
    return f"@{path}"


def note_unapplied_fields(stage, before_text, now_text):
    """Say which execution fields or labels changed for a stage that is not rerun for them, and how to apply them."""
    try:
        before = vg.flat_fields(json.loads(before_text))
    except (ValueError, AttributeError):  # a stage config file cut short: nothing to compare with
        return
    now = vg.flat_fields(json.loads(now_text))
    changed = [
        f"{path} {json.dumps(before.get(path))} -> {json.dumps(value)}"
        for path, value in now.items()
        if before.get(path) != value
    ]
    if changed:
        print(
            f"note: {stage}: {'; '.join(changed)}: how it runs, not what it makes: nothing complete reruns, "
            f"the stage's next run applies it (`--forcerun {stage}` reruns it and what follows it)",
            file=sys.stderr,
        )


def code(stage):
    """Digest of the package code the stage runs: a param, since Snakemake does not see imported code."""
    return stage_code(stage)


def evalkit_sources():
    """The EvalKit files its source digest covers: inputs, so that an edit reruns the fingerprint (whatever
    reward.kind: evaluation scores with the EvalKit)."""
    root = Path(CFG.evalkit.path)
    if not (root / "run_evaluation.py").is_file():
        return []
    return [local(str(root / rel)) for rel in evalkit_files(root)]


def download_code(stage):
    """A download rule's code param: the generator's code for generated inputs, none for pinned Hub
    snapshots (their revision fixes their bytes), so editing the package never downloads again."""
    if stage in ("fetch_judge", "fetch_kernel"):
        return "pinned Hub snapshot"
    generated = CFG.model.source == "tiny" if stage == "fetch_model" else CFG.data.source == "synthetic"
    return code(stage) if generated else "pinned Hub snapshot"


def object_storage_only(**named):
    """Inputs or outputs declared only when the run's files live in object storage (see OBJECT_STORAGE)."""
    return named if OBJECT_STORAGE else {}


def dataset_inputs(*names):
    """The dataset's files beside dataset.json that a stage reads from its directory, declared in object storage
    only (where the directory holds nothing but declared local copies): `splits`, `materialization`, `raw`."""
    parts = {
        "splits": f"{DATASET}/splits.json",
        "materialization": f"{DATASET}/materialization.json",
        "raw": f"{DATASET}/raw",
    }
    return object_storage_only(**{name: parts[name] for name in names})


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
# release evaluation, REFERENCE section 10), so they are always in the DAG; preflight and training read them
# only for the rule reward (RULE_REWARD_STAGES).
EVALKIT_STAGES = ("fingerprint_evalkit", "check_scorer_runtime")
RULE_REWARD_STAGES = EVALKIT_STAGES if RULE_REWARD else ()
STAGE_MANIFESTS = {
    "fetch_model": f"{MODEL}/fetch_model.manifest.json",
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


def matrix_manifests():
    """The manifests behind the run's matrix, by `stage` or `stage:model:sampler`: the report's provenance and
    RO-Crate include every cell."""
    found = {"eval_set": f"{EVALSET}/eval_set.manifest.json"}
    for name, spec in CFG.matrix.hub_models.items():
        if name in CFG.matrix.models:
            key = layout.hub_model_key(name, spec)
            found[f"fetch_eval_model:{name}"] = f"{RESULTS}/models/eval/{key}/fetch_eval_model.manifest.json"
    for name, sampler, cell in matrix_cells():
        found[f"generate_cell:{name}:{sampler}"] = f"{cell}/generate_cell.manifest.json"
        found[f"score_cell:{name}:{sampler}"] = f"{cell}/score_cell.manifest.json"
    found["matrix"] = f"{RUN}/matrix.manifest.json"
    return found


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


# Stage -> (its input functions, its named inputs): what check_inputs checks before the stage's job starts.
CHECKED_INPUTS = {}
CHECK_STAMPS = {}  # stage -> its stamp's path pattern


def checked(stage, where, *functions, **named):
    """A stage's named inputs and the stamp of check_inputs (checks.smk) for them: the stage runs only after its
    inputs passed, so a refusal costs none of its earlier outputs. `where` is the directory of the stamp (a
    matrix cell's own, with its wildcards); `functions` are the rule's unpack()ed input functions."""
    CHECKED_INPUTS[stage] = (functions, named)
    CHECK_STAMPS[stage] = f"{where}/.checked/{stage}"
    # ancient: a stamp left by a check whose stage never started (another job failed first) reruns nothing.
    return {**named, "checked_inputs": ancient(CHECK_STAMPS[stage])}


def upstream_args(wildcards, input):
    """The `--upstream` arguments of a rule's manifest inputs (a params function)."""
    return " ".join(f"--upstream {path}" for name, path in input.items() if name.endswith("_manifest"))


def cluster_resources(kind):
    """SLURM resources of a compute job, all from config (`slurm:` and `parallel:`), none hard-coded; under
    profiles/kubernetes, the executor plugin's (kubernetes_resources).

    kind: `train` (every node of the run, all their GPUs), `preflight` or `evaluate` (one GPU, the
    cores and memory of `slurm.stage_*`), `generate` (a matrix cell: matrix.procs GPUs of one node) or
    `cpu` (data, scorer-runtime and scoring jobs). Local execution ignores them.
    """
    if KUBERNETES:
        return kubernetes_resources(kind)
    s = CFG.slurm
    gpus = s.gpus_per_node
    if gpus is None:
        gpus = CFG.parallel.procs_per_node if CFG.parallel.device == "cuda" else 0
    res = {}
    if s.partition:
        res["slurm_partition"] = s.partition
    if s.account:
        res["slurm_account"] = s.account
    if kind == "cpu":
        return dict(res, cpus_per_task=s.data_cpus, mem_mb=s.data_mem_mb, runtime=s.data_minutes)
    if kind == "train":
        res.update(
            nodes=CFG.parallel.nodes,
            tasks=CFG.parallel.nodes,
            cpus_per_task=s.cpus_per_node,
            mem_mb=s.mem_mb_per_node,
            runtime=s.train_minutes,
        )
    else:
        res.update(
            nodes=1,
            tasks=1,
            cpus_per_task=s.stage_cpus,
            mem_mb=s.stage_mem_mb,
            runtime=s.preflight_minutes if kind == "preflight" else s.evaluate_minutes,
        )
        gpus = min(gpus, CFG.matrix.procs if kind == "generate" else 1)
    if gpus:
        res["gres"] = f"gpu:{gpus}"
    if s.constraint:
        res["constraint"] = s.constraint
    return res


def kubernetes_resources(kind):
    """The pod of a compute job under snakemake-executor-plugin-kubernetes, from `kubernetes:` (GPUs, their
    manufacturer, the node type) and the memory of `slurm:` (the same sizes on either scheduler). A training run
    of several nodes is the indexed Job of k8s_job.py, sized there: its rule is local, its resources unused."""
    k, s = CFG.kubernetes, CFG.slurm
    # cpus_per_task: the worker counts the stages take from it; the pod's CPU request is the rule's threads.
    if kind == "cpu":
        return {"mem_mb": s.data_mem_mb, "cpus_per_task": s.data_cpus}
    if kind == "train":
        res, gpus = {"mem_mb": k.mem_mb_per_node, "cpus_per_task": k.cpus_per_node}, k8s_job.gpus_per_node(CFG)
    else:
        res = {"mem_mb": s.stage_mem_mb, "cpus_per_task": s.stage_cpus}
        gpus = min(k8s_job.gpus_per_node(CFG), CFG.matrix.procs if kind == "generate" else 1)
    if gpus:
        res.update(gpu=gpus, gpu_manufacturer=k.gpu_manufacturer)
        if k.machine_type:
            res["machine_type"] = k.machine_type
    return res


def train_job_submit():
    """The train rule's command prefix: under profiles/kubernetes with several nodes, `videogrpo k8s-job`, which
    writes the run's Job beside it (`k8s/train-job.yaml`), applies it and waits; every pod runs the training
    command that follows `--`. Elsewhere nothing: the rule runs the training command itself."""
    if not K8S_TRAIN_JOB:
        return ""
    spec = f"{RUN}/k8s/train-job.yaml"
    return (
        f"videogrpo k8s-job --config-json {shlex.quote(stage_config('train'))} --run-id {RUN_ID}"
        f" --spec {shlex.quote(spec)} --apply -- "
    )


def eval_tree_inputs():
    """eval_set's inputs: the materialized dataset it builds the set from (its index and split manifest, checked
    against materialize_dataset's manifest), or every file of the external tree (so that an edit reruns the
    check, which then refuses it); nothing while the external tree is absent (dry runs)."""
    if not CFG.matrix.eval_set:
        return {
            "index": f"{DATASET}/dataset.json",
            **upstream("materialize_dataset"),
            **dataset_inputs("splits", "raw"),
        }
    root = Path(EVAL_TREE)
    if not (root / "split_manifest.json").is_file():
        return {}
    return {"tree_files": [local(str(path)) for path in sorted(root.rglob("*")) if path.is_file()]}


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
    if kind == "trained":
        named.update(final=f"{RUN}/train/final", **upstream("train"))
    return named


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


STAGE_MANIFESTS.update(matrix_manifests())
if "SLURM_JOB_ID" not in os.environ:  # as the invocation file: the driver's view of the run
    atomic.write_json(stage_list(RESULTS, RUN_ID), {**STAGE_MANIFESTS, "report": f"{RUN}/report.manifest.json"})


# The checks ahead of the stages (checks.smk).
# The stages that read the EvalKit checkout: it must be at evalkit.digest before they start.
EVALKIT_READERS = {"fingerprint_evalkit", "check_scorer_runtime", "score_cell"} | ({"train"} if RULE_REWARD else set())
# Pinned as a whole (the EvalKit by evalkit.digest, an external tree by matrix.eval_set_digest): no stage made them.
PINNED_INPUTS = {"sources", "tree_files"}
# File digests of earlier checks (see videogrpo/pipeline/check_inputs.py): a pipeline is hashed once.
DIGEST_CACHE = f"{RESULTS}/.checked-digests.json"


def check_inputs_of(wildcards):
    """The named inputs of the stage whose stamp this is; a matrix cell's by its model and sampler (the last two
    parts of its directory)."""
    functions, named = CHECKED_INPUTS[wildcards.stage]
    cell = SimpleNamespace(model=Path(wildcards.where).parent.name, sampler=Path(wildcards.where).name)
    found = {}
    for function in functions:
        found.update(function(cell))
    for name, value in named.items():
        found[name] = value.format(**vars(cell)) if isinstance(value, str) and "{" in value else value
    return found


def check_inputs_args(wildcards, input):
    """--upstream for every manifest, --input for every file a stage made, and the stage's pins."""
    args = []
    for name, value in input.items():
        if name in PINNED_INPUTS:
            continue
        path = shlex.quote(str(value))
        args.append(f"--upstream {path}" if str(value).endswith(".manifest.json") else f"--input {name}={path}")
    if wildcards.stage in EVALKIT_READERS:
        args.append(f"--evalkit {shlex.quote(CFG.evalkit.path)}={CFG.evalkit.digest}")
    if wildcards.stage == "eval_set" and CFG.matrix.eval_set:
        args.append(f"--tree {shlex.quote(EVAL_TREE)}={CFG.matrix.eval_set_digest}")
    return " ".join(args)


def remove_leftover_stamps():
    """Stamps of checks whose stage never started (another job failed first, Ctrl-C): removed, so that a stage
    that runs is always checked just before."""
    cells = [{"model": CELL_MODELS[name], "sampler": sampler} for name, sampler, _ in matrix_cells()]
    for pattern in CHECK_STAMPS.values():
        for fields in cells if "{model}" in pattern else [{}]:
            Path(pattern.format(**fields)).unlink(missing_ok=True)


def check_inputs_command(wildcards, input, output, log):
    """The command of a check_inputs job (its run block): the stage, its inputs and pins, the digest cache."""
    return (
        f"videogrpo check-inputs --stage {wildcards.stage} {check_inputs_args(wildcards, input)}"
        f" --digest-cache {shlex.quote(DIGEST_CACHE)} --out {shlex.quote(output.stamp)} > {shlex.quote(log[0])} 2>&1"
    )
