# videogrpo: a video diffusion model from pinned downloads through GRPO to an evaluated checkpoint,
# with a manifest of digests for every artifact. Stages live in workflow/rules/, logic in src/videogrpo.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/evalkit.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/matrix.smk"
include: "workflow/rules/report.smk"


# Every declared output of every stage, not only the report: Snakemake checks only the outputs some job
# requests, so an output nothing downstream reads (train/final, the dataset's index) that a failure or a
# person removed would never be made again by a plain rerun.
rule all:
    default_target: True
    input:
        REPORT_HTML,
        **STAGE_MANIFESTS,
        outputs=every_stage_output,
    localrule: True
