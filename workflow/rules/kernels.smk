# The attention backend's Hub kernel (parallel.attention_kernel_repo at its pinned revision), only for a
# `*_hub` backend: a download, so a local rule like the other pinned snapshots (compute nodes are often
# offline); training loads it from this cache with HF_HUB_OFFLINE=1.
rule fetch_kernel:
    output:
        kernel=directory(KERNEL_CACHE),
        manifest=f"{KERNEL}/fetch_kernel.manifest.json",
    log:
        f"{KERNEL}/fetch_kernel.log",
    localrule: True
    params:
        **stage_params("fetch_kernel"),
        config=stage_config("fetch_kernel"),
        code=code("fetch_kernel"),
    shell:
        "videogrpo stage fetch-kernel --config-json {params.config:q} --out {output.kernel:q}"
        " --manifest {output.manifest:q} > {log:q} 2>&1"
