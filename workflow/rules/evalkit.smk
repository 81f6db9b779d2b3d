# The checkout is no input: it is pinned by evalkit.digest (a param), and where it lives is an execution detail, so a
# moved copy reruns nothing; a missing or edited one is refused before any job that reads it (start_check.py).
rule fingerprint_evalkit:
    output:
        fingerprint=f"{EVALKIT}/fingerprint.json",
        manifest=f"{EVALKIT}/fingerprint_evalkit.manifest.json",
    log:
        f"{EVALKIT}/fingerprint_evalkit.log",
    localrule: True
    params:
        **stage_params("fingerprint_evalkit"),
        config=stage_config("fingerprint_evalkit"),
        code=code("fingerprint_evalkit"),
    shell:
        "videogrpo stage fingerprint-evalkit --config-json {params.config:q} --out {output.fingerprint:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"


rule check_scorer_runtime:
    input:
        **upstream("fingerprint_evalkit"),
        fingerprint=f"{EVALKIT}/fingerprint.json",
    output:
        runtime=f"{EVALKIT}/scorer_runtime.json",
        manifest=f"{EVALKIT}/check_scorer_runtime.manifest.json",
    log:
        f"{EVALKIT}/check_scorer_runtime.log",
    resources:
        **cluster_resources("cpu"),
    params:
        **stage_params("check_scorer_runtime"),
        config=stage_config("check_scorer_runtime"),
        code=code("check_scorer_runtime"),
        upstream=upstream_args,
    shell:
        "videogrpo stage check-scorer-runtime --config-json {params.config:q} --fingerprint {input.fingerprint:q}"
        " --out {output.runtime:q} {params.upstream} --manifest {output.manifest:q} > {log:q} 2>&1"
