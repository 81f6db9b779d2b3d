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
# File digests of earlier checks (see videogrpo/provenance/check_inputs.py): a pipeline is hashed once.
DIGEST_CACHE = f"{RESULTS}/.checked-digests.json"


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


# A run block, not params: the check's arguments and code must never make its stage rerun (Snakemake keeps
# the metadata of a temp() output after removing it, and a job rerun for changed params or code would make
# every stage after it rerun). The arguments follow from the inputs and the pins, which rerun the stage anyway.
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
    run:
        shell(
            f"videogrpo check-inputs --stage {wildcards.stage} {check_inputs_args(wildcards, input)}"
            f" --digest-cache {shlex.quote(DIGEST_CACHE)} --out {shlex.quote(output.stamp)}"
            f" > {shlex.quote(log[0])} 2>&1"
        )
