"""Fields that are gone, each with where what it set lives now: a config that still gives one is refused by name
(`retired_problems`, before anything is read), never read as something else or silently dropped."""

from __future__ import annotations

from typing import Any

# The quick held-out check that the `evaluate` section configured is now the matrix's
# cell pair (trained and base under the training sampler) on the run's one evaluation set.
_CHECK_IS_CELLS = (
    "the `evaluate` section is gone: the held-out check is the matrix's cells of the trained and base models"
)
# A site's cluster sizing is the profile's (default-resources, and set-resources per rule), where Snakemake reads it;
# the GPUs, nodes and tasks that the topology fixes the workflow derives (pipeline/resources.py).
_SLURM_PROFILE = "profiles/slurm/config.yaml"
_SITE_SIZING = "the `slurm` section is gone (a site's sizing is the profile's)"
_CPU_RULES = "materialize_dataset, validate_dataset, check_scorer_runtime, eval_set, score_cell"
_CPU_JOBS = f"of {_SLURM_PROFILE} (the CPU jobs: {_CPU_RULES})"
_GPU_JOBS = f"of {_SLURM_PROFILE}"
_SLURM_HOMES = {
    "": f"set default-resources, and set-resources per rule, in {_SLURM_PROFILE}; delete the section",
    "partition": f"set slurm_partition under default-resources of {_SLURM_PROFILE} (or under set-resources: <rule>)",
    "account": f"set slurm_account under default-resources of {_SLURM_PROFILE}",
    "constraint": f"set constraint under set-resources: train, preflight and generate_cell {_GPU_JOBS}",
    "gpus_per_node": (
        "GPUs follow the topology (parallel.procs_per_node per training node on cuda, 1 for preflight, "
        "min(procs_per_node, matrix.procs) for a matrix cell); delete the field"
    ),
    "cpus_per_node": f"set cpus_per_task under set-resources: train {_GPU_JOBS}",
    "mem_mb_per_node": f"set mem_mb under set-resources: train {_GPU_JOBS}",
    "train_minutes": f"set runtime (minutes) under set-resources: train {_GPU_JOBS}",
    "train_retries": "set train.retries (how often a failed training job starts again)",
    "evaluate_minutes": f"set runtime (minutes) under set-resources: generate_cell {_GPU_JOBS}",
    "preflight_minutes": f"set runtime (minutes) under set-resources: preflight {_GPU_JOBS}",
    "stage_cpus": f"set cpus_per_task under set-resources: preflight and generate_cell {_GPU_JOBS}",
    "stage_mem_mb": f"set mem_mb under set-resources: preflight and generate_cell {_GPU_JOBS}",
    "data_cpus": f"set cpus_per_task under default-resources {_CPU_JOBS}",
    "data_mem_mb": f"set mem_mb under default-resources {_CPU_JOBS}",
    "data_minutes": f"set runtime (minutes) under default-resources {_CPU_JOBS}",
}
_K8S_PROFILE = "profiles/kubernetes/config.yaml"
_K8S_FLAG = "the training Job takes it from the executor plugin, as every other pod does: give {}; delete the field"
_K8S_TRAIN = (
    f"the training Job's pods take it from the train rule's resources: set {{}} under set-resources: train of "
    f"{_K8S_PROFILE}"
)
_KUBERNETES_HOMES = {
    "image": _K8S_FLAG.format("--container-image"),
    "namespace": _K8S_FLAG.format("--kubernetes-namespace"),
    "service_account": _K8S_FLAG.format("--kubernetes-service-account-name"),
    "privileged": _K8S_FLAG.format("--kubernetes-privileged"),
    "gpus_per_node": "GPUs follow the topology (parallel.procs_per_node per training pod on cuda); delete the field",
    "gpu_manufacturer": f"set gpu_manufacturer under default-resources of {_K8S_PROFILE}",
    "machine_type": f"set machine_type under set-resources: train, preflight and generate_cell of {_K8S_PROFILE}",
    "cpus_per_node": _K8S_TRAIN.format("cpus_per_task"),
    "mem_mb_per_node": _K8S_TRAIN.format("mem_mb"),
    "shm_mb": _K8S_TRAIN.format("shm_mb"),
    "train_retries": "set train.retries (how often each node's pod of the training Job starts again)",
}
RETIRED_FIELDS = {
    "evaluate": f"{_CHECK_IS_CELLS}; delete the section",
    "evaluate.split": f"{_CHECK_IS_CELLS}; set matrix.split (the evaluation set built from the dataset)",
    "evaluate.max_samples_per_task": f"{_CHECK_IS_CELLS}; set matrix.samples_per_task",
    "evaluate.compare_base": f"{_CHECK_IS_CELLS}; set matrix.compare_base",
    "evaluate.seed": f"{_CHECK_IS_CELLS}; set matrix.seed (the noise of every cell)",
    "evaluate.sampling_steps": f"{_CHECK_IS_CELLS}, sampled with the training steps; set grpo.sampling_steps",
    "evaluate.sampler": (
        f"{_CHECK_IS_CELLS}, sampled with the training sampler (grpo.sampler); list other samplers in matrix.samplers"
    ),
    "evaluate.eta": (
        f"{_CHECK_IS_CELLS}, sampled at the training noise level (grpo.eta or grpo.eta_range); list other levels "
        f"in matrix.samplers (flowcps-<eta>, dancegrpo-<eta>)"
    ),
    "matrix.synthetic_per_task": (
        "gone with the synthetic evaluation tree: without matrix.eval_set the evaluation set is built from the "
        "dataset's matrix.split; set matrix.samples_per_task"
    ),
    # The matrix generates with the settings that already hold them (config/cells.py generation_fields).
    "matrix.steps": "every cell samples with the training steps; set grpo.sampling_steps",
    "matrix.guidance_scale": "every cell samples with the training guidance; set grpo.guidance_scale",
    "matrix.fps": "generated videos play at the training frame rate; set video.fps",
    **{f"slurm{'.' if name else ''}{name}": f"{_SITE_SIZING}: {home}" for name, home in _SLURM_HOMES.items()},
    **{f"kubernetes.{name}": home for name, home in _KUBERNETES_HOMES.items()},
}


def retired_problems(data: dict[str, Any]) -> list[str]:
    """Every field of `data` that is gone, with its new home (RETIRED_FIELDS); a field of a retired section that the
    table does not name, or the section given empty, gets the section's."""
    found = []
    for section, given in data.items():
        names = sorted(given) if isinstance(given, dict) else []
        if section in RETIRED_FIELDS:
            gone = [f"{section}.{name}" for name in names]
            found += [f"{path}: {RETIRED_FIELDS.get(path, RETIRED_FIELDS[section])}" for path in gone]
            found += [] if gone else [f"{section}: {RETIRED_FIELDS[section]}"]
        else:
            gone = [path for path in (f"{section}.{name}" for name in names) if path in RETIRED_FIELDS]
            found += [f"{path}: {RETIRED_FIELDS[path]}" for path in gone]
    return found


def retired_in_layers(configfiles: list, overrides: dict[str, Any] | None = None) -> list[str]:
    """retired_problems of each layer, named by its file (or `--config`): the merged config no longer says which
    file still gives a field that is gone, and the fix is an edit of that file."""
    import yaml

    found = []
    for path in configfiles:
        try:
            with open(path) as stream:
                layer = yaml.safe_load(stream) or {}
        except (OSError, yaml.YAMLError):
            continue  # the loader reports an unreadable file itself, naming it
        if isinstance(layer, dict):
            found += [f"{path}: {problem}" for problem in retired_problems(layer)]
    found += [f"--config: {problem}" for problem in retired_problems(overrides or {})]
    return found
