"""The report's cost section: a table of every stage job (provenance/trace.py's rows) with totals, and a
timeline of the jobs on one time axis, as Nextflow's timeline draws its tasks.

Plain HTML and CSS (bars placed in percent of the run's span), no script and nothing fetched: the page
stays one file that opens offline. Each bar carries its start offset and length in seconds (`data-*`),
so that a reader's tooltip and a test's measurement read the same numbers the table shows.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import Any

STYLE = """
.timeline { margin: 1em 0; font-size: 0.8em; }
.tl-row { display: grid; grid-template-columns: 17em 1fr 6em; align-items: center; min-height: 1.4em; }
.tl-row:nth-child(even) { background: #f7f7f7; }
.tl-label { overflow-wrap: anywhere; padding-right: 0.5em; }
.tl-track { position: relative; height: 1em; }
.tl-bar { position: absolute; top: 0; height: 100%; min-width: 2px; background: #7a9cc6; }
.tl-bar.gpu { background: #3d6ea8; }
.tl-bar.failed { background: #c0392b; }
.tl-time { padding-left: 0.5em; white-space: nowrap; color: #555; }
.tl-axis .tl-track { height: 1.2em; border-bottom: 1px solid #999; }
.tl-tick { position: absolute; bottom: 0; transform: translateX(-50%); white-space: nowrap; color: #555; }
.tl-tick.first { transform: none; }
.tl-tick.last { transform: translateX(-100%); }
tfoot td { font-weight: bold; }
"""

STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def duration_text(seconds: float) -> str:
    """A duration as a reader says it: 42.5 s, 3 min 05 s, 2 h 07 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def tick_step(span_s: float, most: int = 8) -> float:
    """The smallest round step that puts at most `most` intervals on the axis."""
    return next((step for step in STEPS_S if span_s / step <= most), STEPS_S[-1] * max(1, round(span_s / most / 86400)))


def _hours(value: Any) -> str:
    return "–" if value is None else f"{value:.4f}"


def _wall(value: Any) -> str:
    return "–" if value is None else f"{value:.1f}"


def cost_table(rows: list[dict[str, Any]], totals: dict[str, Any], job_cell) -> str:
    """One row per job, then the totals (`job_cell`: the job id's HTML, `local` outside SLURM)."""
    head = ["stage", "job id", "state", "host", "start", "wall (s)", "CPU-h", "GPUs", "GPU-h"]

    def gpus(row: dict[str, Any]) -> str:
        if row["gpus"] is None:
            return "–"
        return f"<span title='{html.escape(row['gpus_from'] or '')}'>{row['gpus']}</span>"

    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{cell}</td>"
            for cell in (
                html.escape(row["name"]),
                job_cell(row["job_id"]),
                html.escape(row["state"]),
                html.escape(row["host"] or ""),
                html.escape(row["start"][:19].replace("T", " ")),
                _wall(row["wall_s"]),
                _hours(row["cpu_h"]),
                gpus(row),
                _hours(row["gpu_h"]),
            )
        )
        + "</tr>"
        for row in rows
    )
    foot = (
        f"<tr><td>total ({totals['jobs']} jobs)</td><td></td><td></td><td></td>"
        f"<td>span {html.escape(duration_text(totals['span_s']))}</td><td>{_wall(totals['wall_s'])}</td>"
        f"<td>{_hours(totals['cpu_h'])}</td><td></td><td>{_hours(totals['gpu_h'])}</td></tr>"
    )
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"<table class='cost'><thead><tr>{header}</tr></thead><tbody>{body}</tbody><tfoot>{foot}</tfoot></table>"


def timeline(rows: list[dict[str, Any]]) -> str:
    """One bar per job from its start to its end, on an axis from the first start to the last end."""
    if not rows:
        return ""
    t0 = min(_seconds(r["start"]) for r in rows)
    span = max(max(_seconds(r["end"]) for r in rows) - t0, 1e-3)

    def pct(seconds: float) -> str:
        return f"{100 * seconds / span:.4f}%"

    step = tick_step(span)
    ticks = [i * step for i in range(int(span // step) + 1)]
    marks = "".join(
        f"<span class='tl-tick{' first' if t == 0 else ''}' style='left:{pct(t)}'>"
        f"{html.escape(duration_text(t) if t else '0')}</span>"
        for t in ticks
    )
    marks += f"<span class='tl-tick last' style='left:100%'>{html.escape(duration_text(span))}</span>"
    lines = [
        f"<div class='tl-row tl-axis'><span class='tl-label'>since first start</span>"
        f"<div class='tl-track'>{marks}</div><span></span></div>"
    ]
    for row in rows:
        start, end = _seconds(row["start"]) - t0, _seconds(row["end"]) - t0
        kind = " failed" if row["state"] != "COMPLETED" else (" gpu" if row["gpus"] else "")
        gpus = f", {row['gpus']} GPUs" if row["gpus"] else ""
        title = f"{row['name']}: {row['start']} to {row['end']}, {duration_text(end - start)}{gpus}, {row['state']}"
        lines.append(
            f"<div class='tl-row' data-name='{html.escape(row['name'])}'>"
            f"<span class='tl-label'>{html.escape(row['name'])}</span><div class='tl-track'>"
            f"<div class='tl-bar{kind}' style='left:{pct(start)};width:{pct(end - start)}' "
            f"data-start-s='{start:.3f}' data-length-s='{end - start:.3f}' title='{html.escape(title)}'></div>"
            f"</div><span class='tl-time'>{html.escape(duration_text(end - start))}</span></div>"
        )
    return f"<div class='timeline' data-span-s='{span:.3f}'>{''.join(lines)}</div>"
