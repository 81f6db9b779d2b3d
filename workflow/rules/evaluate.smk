rule evaluate:
    input:
        **checked(
            "evaluate",
            RUN,
            **upstream("fetch_model", "materialize_dataset", "train", "fetch_kernel", *EVALKIT_STAGES),
            **hub_kernel_inputs(kernel=KERNEL_CACHE),
            final=f"{RUN}/train/final",
            model=MODEL_DIR,
            index=f"{DATASET}/dataset.json",
            **dataset_inputs("splits", "raw"),
        ),
    output:
        scores=f"{RUN}/evaluate/scores.csv",
        table=report(
            f"{RUN}/evaluate/per_task.csv",
            caption="../report/evaluation.rst",
            category="Evaluation",
        ),
        videos=directory(f"{RUN}/evaluate/videos"),
        manifest=f"{RUN}/evaluate.manifest.json",
    log:
        f"{RUN}/logs/evaluate.log",
    resources:
        **cluster_resources("evaluate"),
    params:
        **stage_params("evaluate"),
        config=stage_config("evaluate"),
        code=code("evaluate"),
        dataset=directory_of_input("index"),
        evalkit=CFG.evalkit.path,
        upstream=upstream_args,
        records=f"{RUN}/evaluate-records",
        run_id=RUN_ID,
        kernel_env=kernel_env,
    shell:
        "{params.kernel_env} videogrpo stage evaluate --config-json {params.config:q} --model {input.model:q} --final {input.final:q}"
        " --dataset {params.dataset:q} --evalkit {params.evalkit:q} --scores {output.scores:q}"
        " --table {output.table:q} --videos {output.videos:q} --records {params.records:q} --run-id {params.run_id} {params.upstream} --manifest {output.manifest:q}"
        " > {log:q} 2>&1"
