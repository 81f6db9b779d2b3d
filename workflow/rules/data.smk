rule fetch_dataset:
    input:
        **synthetic_inputs(task_list=local(CFG.data.task_list)),
    output:
        archives=directory(ARCHIVES),
        manifest=f"{DATA}/fetch_dataset.manifest.json",
    log:
        f"{DATA}/fetch_dataset.log",
    localrule: True
    params:
        **stage_params("fetch_dataset"),
        config=stage_config("fetch_dataset"),
        code=code("fetch_dataset"),
    shell:
        "videogrpo stage fetch-dataset --config-json {params.config:q} --out {output.archives:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"


# raw/ beside these outputs is not declared: Snakemake would delete it before a rerun, and an
# interrupted unpack must resume. The manifest records it file by file. In object storage it is declared
# (Snakemake uploads only declared outputs), and an interrupted unpack starts over.
rule materialize_dataset:
    input:
        **upstream("fetch_dataset"),
        archives=ARCHIVES,
    output:
        **object_storage_only(raw=directory(f"{DATASET}/raw")),
        index=f"{DATASET}/dataset.json",
        splits=f"{DATASET}/splits.json",
        materialization=f"{DATASET}/materialization.json",
        manifest=f"{DATA}/materialize_dataset.manifest.json",
    log:
        f"{DATA}/materialize_dataset.log",
    resources:
        **cluster_resources("cpu"),
    params:
        **stage_params("materialize_dataset"),
        config=stage_config("materialize_dataset"),
        code=code("materialize_dataset"),
        out=directory_of_output("index"),
        workers=job_workers,
        upstream=upstream_args,
    shell:
        "videogrpo stage materialize-dataset --config-json {params.config:q} --archives {input.archives:q}"
        " --out {params.out:q} --workers {params.workers} {params.upstream} --manifest {output.manifest:q}"
        " > {log:q} 2>&1"


rule validate_dataset:
    input:
        **upstream("materialize_dataset"),
        **dataset_inputs("splits", "materialization", "raw"),
        index=f"{DATASET}/dataset.json",
    output:
        validation=f"{DATA}/validation.json",
        manifest=f"{DATA}/validate_dataset.manifest.json",
    log:
        f"{DATA}/validate_dataset.log",
    resources:
        **cluster_resources("cpu"),
    params:
        **stage_params("validate_dataset"),
        config=stage_config("validate_dataset"),
        code=code("validate_dataset"),
        dataset=directory_of_input("index"),
        workers=job_workers,
        upstream=upstream_args,
    shell:
        "videogrpo stage validate-dataset --config-json {params.config:q} --dataset {params.dataset:q}"
        " --workers {params.workers} --out {output.validation:q} {params.upstream}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"
