rule evaluate:
    input:
        final=f"{RUN}/train/final",
        train_manifest=f"{RUN}/train.manifest.json",
        model=MODEL_DIR,
        index=f"{DATASET}/dataset.json",
    output:
        scores=f"{RUN}/evaluate/scores.csv",
        table=report(
            f"{RUN}/evaluate/per_task.csv",
            caption="../report/evaluation.rst",
            category="Evaluation",
        ),
        videos=directory(f"{RUN}/evaluate/videos"),
        manifest=f"{RUN}/evaluate.manifest.json",
    params:
        config=stage_config("evaluate"),
        code=code("evaluate"),
        dataset=DATASET,
        evalkit=CFG.evalkit.path,
    resources:
        **cluster_resources("evaluate"),
    log:
        f"{RUN}/logs/evaluate.log",
    shell:
        "videogrpo evaluate --config-json {params.config:q} --model {input.model:q} --final {input.final:q}"
        " --dataset {params.dataset:q} --evalkit {params.evalkit:q} --scores {output.scores:q}"
        " --table {output.table:q} --videos {output.videos:q} --manifest {output.manifest:q} > {log:q} 2>&1"
