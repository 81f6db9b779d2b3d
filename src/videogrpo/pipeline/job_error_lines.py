"""Snakemake's account of a failed job, without the `message: None` line it prints for every rule.

Snakemake 9.27.1 prints a failed job as `Error in rule <rule>:` and its details, and among them `message: <the rule's
message>` whenever the log record has a text, so a rule without a `message:` directive (every rule here: each names
its log, whose last lines say what failed and the fix) shows `message: None`, which reads as if something were
missing. `install` drops that one line where Snakemake formats the error; everything else is Snakemake's. Without
the Snakemake internals it relies on, Snakemake's output stays as it is.
"""

from __future__ import annotations

EMPTY_MESSAGE = "    message: None"


def install() -> None:
    try:
        from snakemake.logging import DefaultFormatter
    except ImportError:
        return
    original = getattr(DefaultFormatter, "_format_job_error", None)
    if original is None or getattr(original, "videogrpo", False):
        return

    def format_job_error(self, msg):
        return [line for line in original(self, msg) if line != EMPTY_MESSAGE]

    format_job_error.videogrpo = True
    DefaultFormatter._format_job_error = format_job_error
