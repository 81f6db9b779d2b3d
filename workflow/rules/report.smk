rule report:
    input:
        **STAGE_MANIFESTS,
        matrix_table=MATRIX_TABLE,
        per_task=f"{RUN}/matrix/per_task.csv",
        metrics=f"{RUN}/train/metrics.jsonl",
    output:
        provenance=report(
            f"{RUN}/report/provenance.json",
            caption="../report/provenance.rst",
            category="Provenance",
        ),
        html=report(
            REPORT_HTML,
            caption="../report/report.rst",
            category="Report",
        ),
        crate=f"{RUN}/ro-crate-metadata.json",
        manifest=REPORT_MANIFEST,
    log:
        f"{RUN}/logs/report.log",
    localrule: True
    params:
        **stage_params("report"),
        config=stage_config("report"),
        invocation=str(start.invocation_path(RESULTS)),
        code=code("report"),
        run_id=RUN_ID,
        # From the inputs, not the paths: in object storage a job reads local copies.
        manifests=lambda wildcards, input: " ".join(
            f"--stage-manifest {name}={input[name]}" for name in STAGE_MANIFESTS
        ),
        models=model_files_args,
    shell:
        "videogrpo stage report --config-json {params.config:q} --run-id {params.run_id} {params.manifests} {params.models}"
        " --metrics {input.metrics:q} --per-task {input.per_task:q} --matrix {input.matrix_table:q}"
        " --provenance {output.provenance:q}"
        " --html {output.html:q} --crate {output.crate:q} --invocation {params.invocation:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"
