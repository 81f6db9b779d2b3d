"""The report's view of gold rewards and the divergence alarm (train.validate_rewards): the first screen's line on
whether the alarm fired and which weights best/ holds, the training reward against each gold reward over the
validation points with their intervals and the alarm marked, and per-task panels of the tasks that diverge most.

Everything is read from the validation points' records in metrics.jsonl (grpo/validation.py, grpo/gold_rewards.py).

May import: `metric_rows` and the core modules (matplotlib through report_page's helpers, handed in).
"""

from __future__ import annotations

import html
import math

from videogrpo.provenance.metric_rows import VALIDATION_PREFIX as VAL
from videogrpo.provenance.metric_rows import gold_kinds

Z95 = 1.96


def first_screen(points: list[dict]) -> str:
    """The line of the report's first screen: whether the alarm fired (where, by which reward, in which task), and
    which point's weights best/ holds; "" without gold rewards."""
    kinds = gold_kinds(points)
    if not kinds:
        return ""
    fired = [p for p in points if p.get(f"{VAL}divergence_alarm")]
    names = ", ".join(kinds)
    if fired:
        first = fired[0]
        where = "; ".join(
            f"{s['reward']} fell {s['gold_change']:+.4f} ({'task ' + s['task'] if s['task'] else 'all prompts'}, "
            f"standard error {s['gold_stderr']:.4f}) while the training reward rose {s['train_change']:+.4f} "
            f"since update {s['since']}"
            for s in first[f"{VAL}divergence"]
        )
        text = (
            f"<p class='warn'><b>Divergence alarm fired</b> at update {first['step']} (at {len(fired)} of "
            f"{len(points)} validation points): {html.escape(where)}. The training reward may be gamed: see the gold "
            f"rewards ({html.escape(names)}) below.</p>"
        )
    else:
        text = (
            f"<p class='ok'>Divergence alarm: did not fire over {len(points)} validation points (gold rewards: "
            f"{html.escape(names)}).</p>"
        )
    best = [p[f"{VAL}best_update"] for p in points if p.get(f"{VAL}best_update") is not None]
    if best:
        text += f"<p>best/ holds the weights after update {best[-1]}, the best validation point by its gold reward.</p>"
    return text


def _band(points: list[dict], prefix: str) -> tuple[list[int], list[float], list[float]]:
    """The updates, means and 95 % half-widths (1.96 standard errors; 0 where one prompt leaves none) of a reward."""
    rows = [p for p in points if p.get(f"{prefix}reward_mean") is not None]
    half = [Z95 * (p.get(f"{prefix}reward_stderr") or 0.0) for p in rows]
    return [p["step"] for p in rows], [p[f"{prefix}reward_mean"] for p in rows], half


def curves_figure(points: list[dict], plt, updates_axis):
    """The training reward and each gold reward at every validation point, bands at 95 % (the mean's standard error
    over the prompts), the alarm's firings and the best point marked."""
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    for prefix, label, style in [(VAL, "training reward", "-")] + [
        (f"{VAL}{kind}/", f"gold: {kind}", "--") for kind in gold_kinds(points)
    ]:
        steps, mean, half = _band(points, prefix)
        ax.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], alpha=0.15)
        ax.plot(steps, mean, marker="o", markersize=4, linestyle=style, label=f"{label} (band: 95 %)")
    for k, p in enumerate(p for p in points if p.get(f"{VAL}divergence_alarm")):
        ax.axvline(p["step"], color="red", alpha=0.6, linewidth=1.5, label="divergence alarm" if k == 0 else None)
    best = [p[f"{VAL}best_update"] for p in points if p.get(f"{VAL}best_update") is not None]
    if best:
        ax.axvline(best[-1], color="green", alpha=0.6, linestyle=":", label="best/ (keep_best_by)")
    ax.set_xlabel("optimizer update (validation points)")
    ax.set_ylabel("mean reward, held-out prompts")
    updates_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def diverging_tasks(points: list[dict], top: int = 4) -> list[tuple[str, str, float]]:
    """The (task, gold reward, divergence) of the tasks that diverge most: from the first to the last validation
    point, the training reward's change minus the gold reward's, largest first (only where both moved apart)."""
    if len(points) < 2:
        return []
    first, last = points[0], points[-1]
    found = []
    for kind in gold_kinds(points):
        gold_first = first.get(f"{VAL}{kind}/reward_per_task") or {}
        gold_last = last.get(f"{VAL}{kind}/reward_per_task") or {}
        for task, trained_last in (last.get(f"{VAL}reward_per_task") or {}).items():
            trained_first = (first.get(f"{VAL}reward_per_task") or {}).get(task)
            if trained_first is None or task not in gold_first or task not in gold_last:
                continue
            apart = (trained_last - trained_first) - (gold_last[task] - gold_first[task])
            if math.isfinite(apart) and apart > 0:
                found.append((task, kind, apart))
    return sorted(found, key=lambda row: -row[2])[:top]


def tasks_figure(points: list[dict], plt, updates_axis, wrap):
    """One small panel per diverging task: its training reward and its gold reward at every validation point."""
    chosen = diverging_tasks(points)
    if not chosen:
        return None
    fig, axes = plt.subplots(1, len(chosen), figsize=(2.8 * len(chosen), 2.3), dpi=90, squeeze=False)
    for ax, (task, kind, apart) in zip(axes.flat, chosen):
        for prefix, label in ((VAL, "training"), (f"{VAL}{kind}/", kind)):
            rows = [(p["step"], (p.get(f"{prefix}reward_per_task") or {}).get(task)) for p in points]
            rows = [(s, v) for s, v in rows if v is not None]
            ax.plot([s for s, _ in rows], [v for _, v in rows], marker=".", linewidth=1, label=label)
        ax.set_title(f"{wrap(task, 28)}\napart {apart:+.3f}", fontsize=7)
        ax.tick_params(labelsize=6)
        updates_axis(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def section(points: list[dict], figure_png, pyplot, updates_axis, wrap, table) -> str:
    """The report's section on the gold rewards ("" without them); report_page hands in its drawing and table
    helpers."""
    kinds = gold_kinds(points)
    if not kinds:
        return ""
    plt = pyplot()
    parts = [
        "<h3>Gold rewards and the divergence alarm</h3>",
        "<p>The training reward and each gold reward (train.validate_rewards: scored on the validation videos, never "
        "trained on) at every validation point, with 95 % bands from the standard error of the mean over the prompts; "
        "red lines: points where the divergence alarm fired; green: the point best/ holds.</p>",
        f"<img alt='gold rewards' src='data:image/png;base64,{figure_png(curves_figure(points, plt, updates_axis))}'>",
    ]
    if (fig := tasks_figure(points, plt, updates_axis, wrap)) is not None:
        parts.append("<p>The tasks that diverge most (training reward up, gold reward down, first to last point):</p>")
        parts.append(f"<img alt='diverging tasks' src='data:image/png;base64,{figure_png(fig)}'>")
    columns = ["step", "val/reward_mean", "val/reward_stderr"]
    for kind in kinds:
        columns += [f"val/{kind}/reward_mean", f"val/{kind}/reward_stderr", f"val/{kind}/reward_errors"]
    parts.append(table(points, [*columns, "val/divergence_alarm"]))
    return "\n".join(parts)
