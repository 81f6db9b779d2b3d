# Checkpoints go to {RUN}/checkpoints/, outside the declared outputs (Snakemake deletes those before a
# rerun), so a retried or resubmitted job resumes from the last complete checkpoint.
rule train:
    input:
        preflight=f"{RUN}/preflight.json",
        model=MODEL_DIR,
        index=f"{DATASET}/dataset.json",
        **upstream("fetch_model", "materialize_dataset", "preflight"),
    output:
        final=directory(f"{RUN}/train/final"),
        metrics=f"{RUN}/train/metrics.jsonl",
        manifest=f"{RUN}/train.manifest.json",
    params:
        config=stage_config("train"),
        code=code("train"),
        run_id=RUN_ID,
        run_dir=RUN,
        dataset=DATASET,
        evalkit_args=f"--evalkit {CFG.evalkit.path}" if RULE_REWARD else "",
        upstream=upstream_args,
    threads: CFG.parallel.procs_per_node
    retries: CFG.slurm.train_retries
    resources:
        **cluster_resources("train"),
    log:
        f"{RUN}/logs/train.log",
    shell:
        "videogrpo train --config-json {params.config:q} --run-id {params.run_id} --run-dir {params.run_dir:q}"
        " --model {input.model:q} --dataset {params.dataset:q} --preflight {input.preflight:q}"
        " {params.evalkit_args} --final {output.final:q} --metrics {output.metrics:q}"
        " {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"
