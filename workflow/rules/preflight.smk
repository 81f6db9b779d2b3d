rule preflight:
    input:
        **upstream("fetch_model", "validate_dataset", "fetch_kernel", *RULE_REWARD_STAGES),
        # In object storage the dataset directory is no local path: its splits come as a declared input.
        **dataset_inputs("splits"),
        **object_storage_only(**upstream("materialize_dataset")),
        **hub_kernel_inputs(kernel=KERNEL_CACHE),
        **rule_reward_inputs(
            evalkit_fingerprint=f"{EVALKIT}/fingerprint.json",
            scorer_runtime=f"{EVALKIT}/scorer_runtime.json",
        ),
        model=MODEL_DIR,
        validation=f"{DATA}/validation.json",
    output:
        report=f"{RUN}/preflight.json",
        manifest=f"{RUN}/preflight.manifest.json",
    log:
        f"{RUN}/logs/preflight.log",
    resources:
        **cluster_resources("preflight"),
    params:
        **stage_params("preflight"),
        config=stage_config("preflight"),
        code=code("preflight"),
        dataset=directory_of_input("splits") if OBJECT_STORAGE else DATASET,
        upstream=upstream_args,
        reward_args=lambda wildcards, input: (
            f"--evalkit-fingerprint {input.evalkit_fingerprint} --scorer-runtime {input.scorer_runtime}"
            if RULE_REWARD
            else ""
        ),
        kernel_args=lambda wildcards, input: (
            f"--kernel-cache {input.kernel} --kernel-manifest {input.fetch_kernel_manifest}" if HUB_KERNEL else ""
        ),
    shell:
        "videogrpo stage preflight --config-json {params.config:q} --model {input.model:q}"
        " --model-manifest {input.fetch_model_manifest:q} --dataset {params.dataset:q}"
        " --validation {input.validation:q} {params.reward_args} {params.kernel_args} --out {output.report:q}"
        " {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"
