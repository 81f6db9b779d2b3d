rule fetch_model:
    output:
        model=directory(MODEL_DIR),
        manifest=f"{MODEL}/fetch_model.manifest.json",
    log:
        f"{MODEL}/fetch_model.log",
    localrule: True
    params:
        **stage_params("fetch_model"),
        config=stage_config("fetch_model"),
        code=code("fetch_model"),
    shell:
        "videogrpo stage fetch-model --config-json {params.config:q} --out {output.model:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"


rule fetch_judge:
    output:
        judge=directory(f"{JUDGE}/model"),
        manifest=f"{JUDGE}/fetch_judge.manifest.json",
    log:
        f"{JUDGE}/fetch_judge.log",
    localrule: True
    params:
        **stage_params("fetch_judge"),
        config=stage_config("fetch_judge"),
        code=code("fetch_judge"),
    shell:
        "videogrpo stage fetch-judge --config-json {params.config:q} --out {output.judge:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"
