# Checkpoints go to {RUN}/checkpoints/, outside the declared outputs (Snakemake deletes those before a
# rerun), so a retried or resubmitted job resumes from the last complete checkpoint. In object storage the
# stage mirrors them to the bucket while it trains (--checkpoint-store, object_store.py).
# Under profiles/kubernetes with several nodes the rule runs on the driver, which writes the run's indexed
# Job beside it and waits for it (`videogrpo stage k8s-job`, k8s_job.py): every pod runs the same training command.
# The profile's interconnect settings (set-resources: train: interconnect_env) reach every node's workers.
rule train:
    input:
        **upstream("fetch_model", "fetch_judge", "fetch_kernel", "materialize_dataset", "preflight"),
        **judge_service_inputs(judge=f"{JUDGE}/model"),
        **hub_kernel_inputs(kernel=KERNEL_CACHE),
        **refiner_inputs(),
        **dataset_inputs("splits", "raw"),
        preflight=f"{RUN}/preflight.json",
        model=MODEL_DIR,
        index=f"{DATASET}/dataset.json",
    output:
        **export_outputs(),
        final=directory(f"{RUN}/train/final"),
        metrics=f"{RUN}/train/metrics.jsonl",
        manifest=f"{RUN}/train.manifest.json",
    log:
        f"{RUN}/logs/train.log",
    retries: TRAIN_RETRIES
    localrule: K8S_TRAIN_JOB
    threads: CFG.parallel.procs_per_node
    resources:
        **cluster_resources("train"),
    params:
        **stage_params("train"),
        config=stage_config("train"),
        code=code("train"),
        run_id=RUN_ID,
        run_dir=directory_of_output("manifest"),
        dataset=directory_of_input("index"),
        judge_args=f"--judge-model {JUDGE}/model" if JUDGE_SERVICE else "",
        kernel_args=lambda wildcards, input: f"--kernel-cache {input.kernel}" if HUB_KERNEL else "",
        upstream=upstream_args,
        refiners=refiner_args,
        submit=train_job_submit,
        checkpoint_store=checkpoint_store_args,
        interconnect=interconnect_args,
    shell:
        "{params.submit}videogrpo stage train --config-json {params.config:q} --run-id {params.run_id} --run-dir {params.run_dir:q}"
        " --model {input.model:q} --dataset {params.dataset:q} --preflight {input.preflight:q}"
        " {params.judge_args} {params.kernel_args} {params.refiners} --final {output.final:q} --metrics {output.metrics:q}"
        " {params.checkpoint_store} {params.interconnect} {params.upstream} --manifest {output.manifest:q} 2>&1 | python3 -m videogrpo.stages.log_tee {log:q}"
