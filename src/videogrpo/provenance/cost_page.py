"""The report's cost section: a table of every stage job (provenance/trace.py's rows) with totals, and a
timeline of the jobs on one time axis, as Nextflow's timeline draws its tasks.

Plain HTML and CSS (bars placed in percent of the run's span), no script and nothing fetched: the page
stays one file that opens offline. Each bar carries its start offset and length in seconds (`data-*`),
so that a reader's tooltip and a test's measurement read the same numbers the table shows.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime
from typing import Any

STYLE = """
.timeline { margin: 1em 0; font-size: 0.8em; }
.tl-row { display: grid; grid-template-columns: 19em 1fr 6em; align-items: center; min-height: 1.4em; }
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
.tl-break { position: absolute; top: 0; bottom: 0;
  background: repeating-linear-gradient(45deg, #bbb 0 2px, #fff 2px 5px); }
tfoot td { font-weight: bold; }
"""

STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def duration_text(seconds: float) -> str:
    """A duration as a reader says it: 42.5 s, 3 min 05 s, 2 h 07 min; a round one without its zeros (5 min, 2 h:
    the axis's ticks)."""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds == int(seconds) else f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"


def tick_step(span_s: float, most: int = 8) -> float:
    """The smallest round step that puts at most `most` intervals on the axis."""
    return next((step for step in STEPS_S if span_s / step <= most), STEPS_S[-1] * max(1, round(span_s / most / 86400)))


def _hours(value: Any) -> str:
    return "–" if value is None else f"{value:.4f}"


def _wall(value: Any) -> str:
    return "–" if value is None else f"{value:.1f}"


def span_text(totals: dict[str, Any]) -> str:
    """The totals' time: first start to last end, and, where idle gaps make most of it (jobs remade at different
    times), how much of it jobs ran, so that the span never reads as the run's duration."""
    span, busy = totals["span_s"], totals.get("busy_s")
    text = f"span {duration_text(span)}"
    if busy is not None and span - busy > max(60.0, 0.5 * busy):
        text += f": jobs ran in {duration_text(busy)} of it (made at different times; the timeline cuts the gaps)"
    return html.escape(text)


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
                job_cell(row["job_id"], row.get("job_claimed")),
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
        f"<td>{span_text(totals)}</td><td>{_wall(totals['wall_s'])}</td>"
        f"<td>{_hours(totals['cpu_h'])}</td><td></td><td>{_hours(totals['gpu_h'])}</td></tr>"
    )
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody><tfoot>{foot}</tfoot></table>"


@dataclass
class Axis:
    """Seconds since the first start -> position on the axis (0 to 1), linear but for each idle gap of more than
    max(CUT_MIN_S, the jobs' busy time): that one is cut to a short break, so that a shared stage made days before
    (a download another run left) does not squeeze this run's jobs into a sliver."""

    pieces: list[tuple[float, float, float, float]]  # (from_s, to_s, shown from, shown per second), in order
    shown: float  # the axis's length in shown seconds
    breaks: list[tuple[float, float]]  # the cut gaps (from_s, to_s)

    def __call__(self, t: float) -> float:
        for begin, end, shown_from, rate in self.pieces:
            if t <= end:
                return (shown_from + (max(t, begin) - begin) * rate) / self.shown
        return 1.0


CUT_MIN_S = 600.0
BREAK_SHARE = 0.04  # of the axis, each cut gap


def axis_of(intervals: list[tuple[float, float]]) -> Axis:
    """The axis for jobs running over `intervals` (seconds since the first start)."""
    busy: list[list[float]] = []
    for begin, end in sorted(intervals):
        if busy and begin <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], end)
        else:
            busy.append([begin, end])
    cut = max(CUT_MIN_S, sum(end - begin for begin, end in busy))
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] > cut]
    kept = busy[-1][1] - busy[0][0] - sum(end - begin for begin, end in gaps)
    shown_break = max(kept, 1e-3) * BREAK_SHARE
    pieces, shown, at = [], 0.0, busy[0][0]
    for begin, end in gaps:
        pieces.append((at, begin, shown, 1.0))
        shown += begin - at
        pieces.append((begin, end, shown, shown_break / (end - begin)))
        shown, at = shown + shown_break, end
    pieces.append((at, busy[-1][1], shown, 1.0))
    return Axis(pieces, max(shown + busy[-1][1] - at, 1e-3), gaps)


def _marks(ax: Axis, span: float) -> str:
    """The axis row: ticks at round offsets in the linear pieces (none crowding another), each break marked."""
    step = tick_step(ax.shown, most=6)
    candidates = [0.0]
    for begin, end, _, rate in ax.pieces:
        if rate == 1.0:
            candidates += [k * step for k in range(int(begin // step) + 1, int(end // step) + 1)]
    placed: list[float] = [1.0]  # the end's label, always
    ticks = []
    for t in candidates:
        if all(abs(ax(t) - p) >= 0.13 for p in placed):  # labels of up to 11 characters
            placed.append(ax(t))
            ticks.append(t)
    marks = "".join(
        f"<span class='tl-tick{' first' if t == 0 else ''}' style='left:{100 * ax(t):.4f}%'>"
        f"{html.escape(duration_text(t) if t else '0')}</span>"
        for t in ticks
    )
    marks += f"<span class='tl-tick last' style='left:100%'>{html.escape(duration_text(span))}</span>"
    for begin, end in ax.breaks:
        marks += (
            f"<span class='tl-break' style='left:{100 * ax(begin):.4f}%;width:{100 * (ax(end) - ax(begin)):.4f}%' "
            f"title='{html.escape(f'idle {duration_text(end - begin)}, cut short')}'></span>"
        )
    return marks


def timeline(rows: list[dict[str, Any]]) -> str:
    """One bar per job from its start to its end, on one axis from the first start to the last end (Axis)."""
    if not rows:
        return ""
    t0 = min(_seconds(r["start"]) for r in rows)
    spans = [(_seconds(r["start"]) - t0, _seconds(r["end"]) - t0) for r in rows]
    ax = axis_of(spans)
    lines = [
        f"<div class='tl-row tl-axis'><span class='tl-label'>since first start</span>"
        f"<div class='tl-track'>{_marks(ax, max(end for _, end in spans))}</div><span></span></div>"
    ]
    for row, (start, end) in zip(rows, spans):
        kind = " failed" if row["state"] != "COMPLETED" else (" gpu" if row["gpus"] else "")
        gpus = f", {row['gpus']} GPUs" if row["gpus"] else ""
        title = f"{row['name']}: {row['start']} to {row['end']}, {duration_text(end - start)}{gpus}, {row['state']}"
        lines.append(
            f"<div class='tl-row' data-name='{html.escape(row['name'])}'>"
            f"<span class='tl-label'>{html.escape(row['name'])}</span><div class='tl-track'>"
            f"<div class='tl-bar{kind}' style='left:{100 * ax(start):.4f}%;width:{100 * (ax(end) - ax(start)):.4f}%' "
            f"data-start-s='{start:.3f}' data-length-s='{end - start:.3f}' title='{html.escape(title)}'></div>"
            f"</div><span class='tl-time'>{html.escape(duration_text(end - start))}</span></div>"
        )
    cut = f" data-breaks='{len(ax.breaks)}'" if ax.breaks else ""
    return f"<div class='timeline' data-span-s='{max(end for _, end in spans):.3f}'{cut}>{''.join(lines)}</div>"
