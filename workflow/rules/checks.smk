# Every stage that reads what other stages made runs after its inputs are checked (see checked() in
# common.smk and videogrpo/provenance/check_inputs.py): Snakemake deletes a job's outputs before the job
# starts, so a stage refusing its inputs itself would already have cost its earlier outputs. The stamp is
# temp(): made whenever its stage is about to run (under --forcerun too), removed once it has.
import shlex
from types import SimpleNamespace

# The stages that read the EvalKit checkout: it must be at evalkit.digest before they start.
EVALKIT_READERS = {"fingerprint_evalkit", "check_scorer_runtime", "evaluate", "score_cell"} | (
    {"train"} if RULE_REWARD else set()
)
# Pinned as a whole (the EvalKit by evalkit.digest, an external tree by matrix.eval_set_digest): no stage made them.
PINNED_INPUTS = {"sources", "tree_files"}


def check_inputs_of(wildcards):
    """The named inputs of the stage whose stamp this is; a matrix cell's by its model and sampler (the last two
    parts of its directory)."""
    functions, named = CHECKED_INPUTS[wildcards.stage]
    cell = SimpleNamespace(model=Path(wildcards.where).parent.name, sampler=Path(wildcards.where).name)
    found = {}
    for function in functions:
        found.update(function(cell))
    for name, value in named.items():
        found[name] = value.format(**vars(cell)) if isinstance(value, str) and "{" in value else value
    return found


def check_inputs_args(wildcards, input):
    """--upstream for every manifest, --input for every file a stage made, and the stage's pins."""
    args = []
    for name, value in input.items():
        if name in PINNED_INPUTS:
            continue
        path = str(value)
        flag = "--upstream" if path.endswith(".manifest.json") else f"--input {name}="
        args.append(f"{flag} {shlex.quote(path)}" if flag == "--upstream" else f"{flag}{shlex.quote(path)}")
    if wildcards.stage in EVALKIT_READERS:
        args.append(f"--evalkit {shlex.quote(CFG.evalkit.path)}={CFG.evalkit.digest}")
    if wildcards.stage == "eval_set" and CFG.matrix.eval_set:
        args.append(f"--tree {shlex.quote(EVAL_TREE)}={CFG.matrix.eval_set_digest}")
    return " ".join(args)


rule check_inputs:
    input:
        unpack(check_inputs_of),
    output:
        stamp=temp("{where}/.checked/{stage}"),
    log:
        "{where}/.checked/{stage}.log",
    wildcard_constraints:
        stage="|".join(CHECKED_INPUTS),
    localrule: True
    params:
        args=check_inputs_args,
        digest_cache=f"{RESULTS}/.checked-digests.json",
    shell:
        "videogrpo check-inputs --stage {wildcards.stage} {params.args} --digest-cache {params.digest_cache:q}"
        " --out {output.stamp:q} > {log:q} 2>&1"
