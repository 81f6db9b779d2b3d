"""Which run a run directory is, how far it got, and the command that rebuilds that run (not the default one).

When a run starts, the workflow records its invocation (the config files and `--config` overrides) under
`results/.stage-config/<run>.invocation.json` beside the list of the manifests it expects (`<run>.stages.json`).
`verify` and `diff` read both: a run whose manifests are missing failed or is unfinished, and the command that
rebuilds it is the one that started it, which a plain `snakemake --cores <N>` is only for the default config.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from videogrpo.provenance.manifest import REBUILD

CONFIG_DIR = ".stage-config"
DEFAULT_CONFIGFILE = "config/config.yaml"  # the Snakefile's own `configfile:`, which every invocation loads


def stage_list(results: str | Path, run_id: str) -> Path:
    """The manifests the workflow expects for a run (written when the workflow starts a run): `verify` names each
    missing one, even when nothing that remains refers to it."""
    return Path(results) / CONFIG_DIR / f"{run_id}.stages.json"


def run_invocation_path(results: str | Path, run_id: str) -> Path:
    """The invocation that last started run `run_id` (results/.stage-config/invocation.json is only the latest
    run's, whichever run that was)."""
    return Path(results) / CONFIG_DIR / f"{run_id}.invocation.json"


def _flow(value: Any) -> str:
    """A --config value as a person types it: `{lr: 2.0e-4, max_steps: 2}`; Snakemake's --config values arrive as
    strings, so they are written back as they were typed, quoted only where YAML would read them otherwise."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    text = str(value)
    if text == "" or re.search(r"[,:{}\[\]#&*!|>'\"%@`]|^\s|\s$", text):
        return json.dumps(text)
    return text


def _shown_path(path: str) -> str:
    """A config file as the user would type it from the workflow directory."""
    absolute = os.path.abspath(path)
    inside = os.path.relpath(absolute)
    return path if not os.path.isabs(path) or inside.startswith("..") else inside


def invocation_command(invocation: dict[str, Any]) -> str:
    """`snakemake --cores <N>` with the config files and --config overrides of a recorded invocation."""
    paths = [entry["path"] for entry in invocation.get("configfiles", [])]
    if paths and paths[-1] == DEFAULT_CONFIGFILE:  # Snakemake lists the Snakefile's own file last: it loads it itself
        paths = paths[:-1]
    words = ["snakemake", "--cores", "<N>"]
    if paths:
        words += ["--configfile", *(shlex.quote(_shown_path(p)) for p in paths)]
    overrides = invocation.get("config_overrides") or {}
    if overrides:
        words += ["--config", *(shlex.quote(f"{key}={_flow(value)}") for key, value in overrides.items())]
    return " ".join(words)


def _load(invocation: dict[str, Any]) -> Any:
    """The config an invocation resolves to with the config files as they are now; None when it no longer loads."""
    from videogrpo import config

    files = [entry["path"] for entry in invocation.get("configfiles", [])]
    try:
        return config.load(files, invocation.get("config_overrides") or {})
    except Exception:  # noqa: BLE001 - a file gone or a config no longer valid: it makes no run now
        return None


def _makes(invocation: dict[str, Any], run_id: str) -> bool:
    """Whether an invocation resolves to run `run_id` with the config files as they are now."""
    from videogrpo import config

    cfg = _load(invocation)
    return cfg is not None and config.run_identity(cfg) == run_id


def run_invocation(results: Path, run_id: str) -> dict[str, Any] | None:
    """The invocation that started run `run_id`: its own record; for a run started before those were kept, the
    latest run's record or the plain default when either resolves to this run now; None when none does."""
    for path in (run_invocation_path(results, run_id), Path(results) / CONFIG_DIR / "invocation.json"):
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if path.name != "invocation.json" or _makes(recorded, run_id):
            return recorded
    plain = {"configfiles": [{"path": DEFAULT_CONFIGFILE}], "config_overrides": {}}
    return plain if _makes(plain, run_id) else None


def run_config(run_dir: Path) -> Any:
    """The run's config as its invocation resolves now (None: no invocation recorded, or it no longer loads): what
    its execution fields (where the EvalKit lives) say today."""
    invocation = run_invocation(run_dir.parent.parent, run_dir.name)
    return _load(invocation) if invocation is not None else None


def rebuild_hint(run_dir: Path, forcerun: list[str] | tuple[str, ...] = ()) -> str:
    """How to rebuild the run in `run_dir` (results/runs/<run>), for a message: every stage whose manifest is
    missing (a plain rerun makes those) and, with `forcerun`, those stages or files again (an output changed in
    place, which no rerun would make again by itself)."""
    results, run_id = run_dir.parent.parent, run_dir.name
    invocation = run_invocation(results, run_id)
    again = f" --forcerun {' '.join(forcerun)}" if forcerun else ""
    if invocation is None:
        return (
            f"`snakemake --cores <N>{again}` and the --configfile and --config options that made run {run_id}, which "
            f"records no invocation: `videogrpo config --configfile ... --set ... --run-id` prints {run_id} for them"
        )
    command = invocation_command(invocation)
    if command == "snakemake --cores <N>" and not forcerun:
        return REBUILD
    changed = [
        entry["path"]
        for entry in invocation.get("configfiles", [])
        if "sha256" in entry and (not os.path.isfile(entry["path"]) or _sha256(entry["path"]) != entry["sha256"])
    ]
    note = (
        f"; but {', '.join(changed)} changed since this run started, so the command now makes another run: restore "
        f"the file(s) first"
        if changed
        else ""
    )
    what = "every stage whose manifest is missing" + (f", and {' '.join(forcerun)} again" if forcerun else "")
    return f"`{command}{again}` (the invocation that started run {run_id}; it rebuilds {what}{note})"


def _sha256(path: str) -> str:
    from videogrpo.provenance.digest import sha256_file

    return sha256_file(path)


def missing_stages(run_dir: Path) -> list[str] | None:
    """The stages whose manifests the run's stage list names and that are not there (empty: none missing); None
    when the run records no stage list (a run started before lists were written)."""
    listed = stage_list(run_dir.parent.parent, run_dir.name)
    try:
        expected = json.loads(listed.read_text())
    except (OSError, ValueError):
        return None
    return [name for name, path in sorted(expected.items()) if not Path(path).is_file()]


def run_status(run_dir: Path) -> str | None:
    """None for a run whose every manifest is there (its report built); otherwise why it is not complete and how
    to rebuild it, for `diff` and `verify` to say before anything else."""
    missing = missing_stages(run_dir)
    has_report = (run_dir / "report.manifest.json").is_file()
    if missing == [] or (missing is None and has_report):
        return None
    missing = [name for name in missing or [] if name != "report"]  # the report is said apart
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        what = f"{len(missing)} of its stages have no manifest ({shown})"
        what += ", so its report is out of date" if has_report else ", and it has no report"
    else:
        what = "it has no report"
    return (
        f"{run_dir} is incomplete: {what}. It failed, was interrupted or still runs; `videogrpo verify {run_dir}` "
        f"lists what is missing; rebuild it with {rebuild_hint(run_dir)}"
    )
