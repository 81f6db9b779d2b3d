"""The run's trace: one row per stage job from the manifests' cost blocks (provenance/cost.py), as
Nextflow's trace file has one per task; printed as TSV by `videogrpo trace`, shown as a table and a
timeline in the report, compared by `videogrpo diff`.

A job's state is what its manifest says ("COMPLETED": a manifest exists only for a stage that
succeeded), unless sacct answers for its SLURM job id, whose final state it then is (a job killed after
its stage wrote the manifest shows so). Without sacct, or where it fails (no accounting storage), the
manifests' states stand.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from datetime import datetime
from typing import Any

from videogrpo.provenance.cost import STATE

COLUMNS = ("name", "job_id", "state", "host", "start", "end", "wall_s", "cpu_h", "gpus", "gpu_h")
SACCT_TIMEOUT_S = 20


def job_row(name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """One stage's row; a manifest from before the cost block has no CPU and GPU figures (None)."""
    cost = manifest.get("cost") or {}
    claim = manifest.get("slurm_job") or {}
    return {
        "name": name,
        "job_id": manifest.get("slurm_job_id") or None,
        # A SLURM_JOB_ID its environment held that SLURM did not confirm (provenance/slurm_job.py): no job of it.
        "job_claimed": None if claim.get("confirmed", True) else claim.get("claimed"),
        "state": cost.get("state", STATE),
        "host": manifest.get("host"),
        "start": manifest["started_at"],
        "end": manifest["ended_at"],
        "wall_s": cost.get("wall_s", manifest.get("duration_s")),
        "cpu_h": cost.get("cpu_h"),
        "nodes": cost.get("nodes"),
        "gpus": cost.get("gpus"),
        "gpus_from": cost.get("gpus_from"),
        "gpu_h": cost.get("gpu_h"),
    }


def final_states(job_ids: list[str], sacct: str | None = None) -> dict[str, str]:
    """Job id -> final state, as sacct reports it ({} without sacct, or when it fails or times out)."""
    sacct = sacct or shutil.which("sacct")
    if not sacct or not job_ids:
        return {}
    argv = [sacct, "--noheader", "--parsable2", "--allocations", "--format=JobIDRaw,State", "--jobs", ",".join(job_ids)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SACCT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    states = {}
    for line in done.stdout.splitlines():
        job, _, state = line.partition("|")
        if job in job_ids and state:
            states[job] = state.split()[0]  # "CANCELLED by 1000": the state, not who
    return states


def rows_of(manifests: dict[str, dict[str, Any]], sacct: bool = True) -> list[dict[str, Any]]:
    """Rows of named manifests, by start time; states from sacct where it answers (`sacct`)."""
    rows = sorted((job_row(name, m) for name, m in manifests.items()), key=lambda r: (r["start"], r["name"]))
    if sacct:
        states = final_states(sorted({r["job_id"] for r in rows if r["job_id"]}))
        for row in rows:
            row["state"] = states.get(row["job_id"], row["state"])
    return rows


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over the jobs (None where a job's figure is unknown), and the span from the first start to the
    last end."""

    def total(key: str) -> float | None:
        values = [r[key] for r in rows]
        return None if not values or any(v is None for v in values) else round(sum(values), 6)

    # No jobs (a report of stages that recorded no start and end): nothing spanned, not an error.
    span = max(map(_seconds, (r["end"] for r in rows))) - min(map(_seconds, (r["start"] for r in rows))) if rows else 0
    return {
        "jobs": len(rows),
        "wall_s": total("wall_s"),
        "cpu_h": total("cpu_h"),
        "gpu_h": total("gpu_h"),
        "span_s": round(span, 3),
        "busy_s": round(busy_seconds(rows), 3),
    }


def busy_seconds(rows: list[dict[str, Any]]) -> float:
    """Seconds in which at least one job ran (the union of their intervals): the span less the idle gaps, which
    jobs remade at different times (a rerun stage, a download of days before) leave."""
    busy, reach = 0.0, None
    for start, end in sorted((_seconds(r["start"]), _seconds(r["end"])) for r in rows):
        if reach is None or start > reach:
            busy, reach = busy + end - start, end
        elif end > reach:
            busy, reach = busy + end - reach, end
    return busy


def _field(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
    return str(value).replace("\t", " ")


def tsv(rows: list[dict[str, Any]]) -> str:
    """The trace as TSV: a header of COLUMNS, one line per job; '-' for what is unknown (a job id: it ran
    outside SLURM)."""
    lines = ["\t".join(COLUMNS)]
    lines += ["\t".join(_field(row[c]) for c in COLUMNS) for row in rows]
    return "\n".join(lines) + "\n"


def _change(a: float | None, b: float | None, unit: str, digits: int) -> str:
    if a is None or b is None:
        return f"{'-' if a is None else f'{a:.{digits}f}'} | {'-' if b is None else f'{b:.{digits}f}'} {unit}"
    ratio = f" ({(b - a) / a * 100:+.1f} %)" if a and math.isfinite(a) else ""
    return f"{a:.{digits}f} | {b:.{digits}f} {unit}{ratio}"


def cost_lines(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]]) -> list[str]:
    """The cost change from run a to run b: the totals, then each job whose figures differ (a job both runs
    share, such as a download, is one manifest with the same figures and is left out)."""

    def line(name: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
        a, b = a or {}, b or {}
        return (
            f"  {name}: wall {_change(a.get('wall_s'), b.get('wall_s'), 's', 1)}, "
            f"CPU {_change(a.get('cpu_h'), b.get('cpu_h'), 'h', 4)}, "
            f"GPU {_change(a.get('gpu_h'), b.get('gpu_h'), 'h', 4)}"
        )

    by_name = [{r["name"]: r for r in rows} for rows in (rows_a, rows_b)]
    changed = sorted(name for name in set(by_name[0]) | set(by_name[1]) if by_name[0].get(name) != by_name[1].get(name))
    out = [line("total", totals(rows_a), totals(rows_b))]
    out += [line(name, by_name[0].get(name), by_name[1].get(name)) for name in changed]
    return out
