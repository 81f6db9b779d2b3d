"""The one way the workflow replaces a method of Snakemake's own (driver_lock, driver_interrupt, job_error_lines,
unstarted_jobs): find the class and its methods, leave everything as it is where this Snakemake lacks one or where
they were replaced already (a Snakefile read twice in one process), and mark what replaces them.

May import: the standard library only (Snakemake itself, lazily).
"""

from __future__ import annotations

import importlib
from typing import Any

MARK = "videogrpo"
"""The attribute set on every replacement: a method that carries it was replaced already."""


def originals(module: str, owner: str, *names: str) -> tuple[Any, ...] | None:
    """(the class `owner` of Snakemake's `module`, then its methods `names`), or None where one of them is missing or
    the first was replaced already: the caller then patches nothing and Snakemake's own behaviour stays."""
    try:
        cls = getattr(importlib.import_module(module), owner)
    except (ImportError, AttributeError):
        return None
    methods = [getattr(cls, name, None) for name in names]
    if any(method is None for method in methods) or getattr(methods[0], MARK, False):
        return None
    return (cls, *methods)


def replace(cls: Any, **methods: Any) -> None:
    """Set each of `methods` on `cls`, marked as replaced."""
    for name, method in methods.items():
        setattr(method, MARK, True)
        setattr(cls, name, method)
