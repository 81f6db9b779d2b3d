"""Snakemake's account of a failed job, without the `message: None` line it prints for every rule.

Snakemake 9.27.1 prints a failed job as `Error in rule <rule>:` and its details, and among them `message: <the rule's
message>` whenever the log record has a text, so a rule without a `message:` directive (every rule here: each names
its log, whose last lines say what failed and the fix) shows `message: None`, which reads as if something were
missing. `install` drops that one line where Snakemake formats the error; everything else is Snakemake's. Without
the Snakemake internals it relies on, Snakemake's output stays as it is.
"""

from __future__ import annotations

from videogrpo.pipeline import snakemake_patch

EMPTY_MESSAGE = "    message: None"


def install() -> None:
    if (found := snakemake_patch.originals("snakemake.logging", "DefaultFormatter", "_format_job_error")) is None:
        return
    formatter, original = found

    def format_job_error(self, msg):
        return [line for line in original(self, msg) if line != EMPTY_MESSAGE]

    snakemake_patch.replace(formatter, _format_job_error=format_job_error)
