# The evaluation matrix: the run's one evaluation set (an external tree pinned, or one built from the dataset's
# split), models validated, one generate and one score job per (model, sampler) cell, the held-out check's cells
# among them, and the run's tables.


wildcard_constraints:
    model="[^/]+",
    sampler="[^/]+",
    hub="[^/]+",


rule eval_set:
    input:
        **eval_tree_inputs(),
    output:
        **eval_set_outputs(),
        samples=f"{EVALSET}/samples.json",
        final_frames=directory(f"{EVALSET}/final_frames"),
        manifest=f"{EVALSET}/eval_set.manifest.json",
    log:
        f"{EVALSET}/eval_set.log",
    resources:
        **cluster_resources("cpu"),
    params:
        **stage_params("eval_set"),
        config=stage_config("eval_set"),
        code=code("eval_set"),
        source=eval_set_source,
        upstream=upstream_args,
    shell:
        "videogrpo stage eval-set --config-json {params.config:q} {params.source} --samples {output.samples:q}"
        " --final-frames {output.final_frames:q} {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"


rule fetch_eval_model:
    output:
        model=directory(f"{RESULTS}/models/eval/{{hub}}/pipeline"),
        manifest=f"{RESULTS}/models/eval/{{hub}}/fetch_eval_model.manifest.json",
    log:
        f"{RESULTS}/models/eval/{{hub}}/fetch_eval_model.log",
    localrule: True
    params:
        **stage_params("fetch_eval_model"),
        config=stage_config("fetch_eval_model"),
        code="pinned Hub snapshot",
        spec=lambda wildcards: HUB_SPECS[wildcards.hub],
        name=lambda wildcards: wildcards.hub.split("@")[0],
    shell:
        "videogrpo stage fetch-eval-model --config-json {params.config:q} --name {params.name:q} --spec {params.spec:q}"
        " --out {output.model:q} --manifest {output.manifest:q} > {log:q} 2>&1"


rule generate_cell:
    input:
        unpack(cell_model_inputs),
        **built_tree_inputs(),
        **upstream("fetch_kernel"),
        **hub_kernel_inputs(kernel=KERNEL_CACHE),
        samples=f"{EVALSET}/samples.json",
        eval_set_manifest=f"{EVALSET}/eval_set.manifest.json",
    output:
        videos=directory(f"{CELL}/videos"),
        manifest=f"{CELL}/generate_cell.manifest.json",
    log:
        f"{CELL}/generate_cell.log",
    resources:
        **cluster_resources("generate"),
    params:
        **stage_params("generate_cell"),
        config=stage_config("generate_cell"),
        code=code("generate_cell"),
        transformer=trained_transformer_arg,
        refiners=cell_refiner_args,
        work=f"{CELL}/.generate-work",
        upstream=upstream_args,
        kernel_env=kernel_env,
    shell:
        "{params.kernel_env} videogrpo stage generate-cell --config-json {params.config:q} --model {input.model:q} {params.transformer} {params.refiners}"
        " --samples {input.samples:q} --sampler {wildcards.sampler:q} --videos {output.videos:q}"
        " --work {params.work:q} {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"


rule score_cell:
    input:
        **upstream(*EVALKIT_STAGES),
        **built_tree_inputs(),
        videos=f"{CELL}/videos",
        samples=f"{EVALSET}/samples.json",
        final_frames=f"{EVALSET}/final_frames",
        generate_cell_manifest=f"{CELL}/generate_cell.manifest.json",
        eval_set_manifest=f"{EVALSET}/eval_set.manifest.json",
    output:
        scores=f"{CELL}/scores.csv",
        aggregate=f"{CELL}/aggregate.csv",
        prepared=directory(f"{CELL}/prepared"),
        manifest=f"{CELL}/score_cell.manifest.json",
    log:
        f"{CELL}/score_cell.log",
    resources:
        **cluster_resources("cpu"),
    params:
        **stage_params("score_cell"),
        config=stage_config("score_cell"),
        code=code("score_cell"),
        work=f"{CELL}/.score-work",
        upstream=upstream_args,
    shell:
        "videogrpo stage score-cell --config-json {params.config:q} --videos {input.videos:q} --samples {input.samples:q}"
        " --final-frames {input.final_frames:q} --scores {output.scores:q}"
        " --aggregate {output.aggregate:q} --prepared {output.prepared:q} --work {params.work:q}"
        " {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"


rule matrix:
    input:
        **matrix_cell_inputs(),
        **model_files()[1],
    output:
        table=report(MATRIX_TABLE, caption="../report/matrix.rst", category="Evaluation"),
        per_task=report(
            f"{RUN}/matrix/per_task.csv",
            caption="../report/evaluation.rst",
            category="Evaluation",
        ),
        manifest=f"{RUN}/matrix.manifest.json",
    log:
        f"{RUN}/logs/matrix.log",
    localrule: True
    params:
        **stage_params("matrix"),
        config=stage_config("matrix"),
        code=code("matrix"),
        cells=matrix_cell_args,
        run_id=RUN_ID,
        upstream=upstream_args,
        models=model_files_args,
    shell:
        "videogrpo stage matrix --config-json {params.config:q} {params.cells} {params.models} --table {output.table:q}"
        " --per-task {output.per_task:q} --run-id {params.run_id} {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"
