# Every stage that reads what other stages made runs after its inputs are checked (see checked() in
# common.smk and videogrpo/pipeline/check_inputs.py): Snakemake deletes a job's outputs before the job
# starts, so a stage refusing its inputs itself would already have cost its earlier outputs. The stamp is
# temp(): made whenever its stage is about to run (under --forcerun too), removed once it has.
# A run block, not params: the check's arguments and code must never make its stage rerun (Snakemake keeps
# the metadata of a temp() output after removing it, and a job rerun for changed params or code would make
# every stage after it rerun). The arguments follow from the inputs and the pins, which rerun the stage anyway.
# Only in the main process: a job's own process (a SLURM step, or a local run block's subprocess) re-reads
# the workflow while other checks may just have made their stamps.
if workflow.is_main_process and "SLURM_JOB_ID" not in os.environ:
    remove_leftover_stamps()


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
        shell(check_inputs_command(wildcards, input, output, log))
