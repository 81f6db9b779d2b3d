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


# One prompt refiner's download (the `refiners` section), keyed by what it is: a Hub snapshot or the tiny builder's.
rule fetch_refiner:
    output:
        refiner=directory(f"{RESULTS}/models/refiners/{{refiner}}/model"),
        manifest=f"{RESULTS}/models/refiners/{{refiner}}/fetch_refiner.manifest.json",
    log:
        f"{RESULTS}/models/refiners/{{refiner}}/fetch_refiner.log",
    localrule: True
    params:
        download=refiner_download_json,
        code=refiner_code,
    shell:
        "videogrpo stage fetch-refiner --download-json {params.download:q} --out {output.refiner:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"
