"""The run report: every stage manifest merged into provenance.json, and a readable HTML page."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from videogrpo.provenance.manifest import now_iso, read_manifest, record_digest


def stages_git_state(stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The workflow checkout's git state as the stages recorded it when they ran: one commit and dirty flag if
    they agree, and each stage's own state."""
    per_stage = {name: m.get("git") for name, m in stages.items()}
    commits = {state["commit"] for state in per_stage.values() if state}
    dirty = any(state and state["dirty"] for state in per_stage.values())
    return {
        "commit": commits.pop() if len(commits) == 1 else sorted(commits) or None,
        "dirty": dirty,
        "stages": per_stage,
    }


def merged_params(manifests) -> dict[str, Any]:
    """The config fields the stages read, merged field by field (a stage that reads a few fields of a section
    adds them, never replaces the section)."""
    merged: dict[str, Any] = {}
    for manifest in manifests:
        for section, value in manifest["params"].items():
            if isinstance(value, dict) and isinstance(merged.get(section), dict):
                merged[section].update(value)
            else:
                merged[section] = value.copy() if isinstance(value, dict) else value
    return merged


def build_provenance(manifests: dict[str, Path], run_id: str, invocation: dict[str, Any]) -> dict[str, Any]:
    stages = {name: read_manifest(path) for name, path in manifests.items()}
    digests = {}
    for name, manifest in stages.items():
        for output, record in manifest["outputs"].items():
            digests[f"{name}.{output}"] = {
                "path": record["path"],
                "sha256": record_digest(record),
                "size": record["size"],
            }
    versions: dict[str, set[str]] = {}
    for manifest in stages.values():
        for package, version in manifest["versions"].items():
            versions.setdefault(package, set()).add(version)
    train = stages.get("train", {})
    return {
        "run_id": run_id,
        "generated_at": now_iso(),
        "git": stages_git_state(stages),
        "invocation": invocation,
        "config": merged_params(stages.values()),
        "digests": digests,
        "versions": {p: sorted(v)[0] if len(v) == 1 else sorted(v) for p, v in sorted(versions.items())},
        "topology": train.get("summary", {}).get("launch"),
        "timings": {
            name: {
                "started_at": m["started_at"],
                "ended_at": m["ended_at"],
                "duration_s": m["duration_s"],
                "host": m["host"],
                "slurm_job_id": m["slurm_job_id"],
            }
            for name, m in stages.items()
        },
        "stages": stages,
    }


def _figure_png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def reward_curve_png(metrics: list[dict]) -> str:
    """The mean reward per update with its spread (one standard deviation over all rollouts), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    mean = [m["reward_mean"] for m in metrics]
    std = [m["reward_std"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    ax.fill_between(steps, [a - b for a, b in zip(mean, std)], [a + b for a, b in zip(mean, std)], alpha=0.2)
    ax.plot(steps, mean, marker="o", markersize=3, linewidth=2, label="mean reward (band: ±1 std)")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return _figure_png(fig)


def per_task_curves_png(metrics: list[dict], columns: int = 5) -> str | None:
    """One small panel per task: its mean reward at the updates whose batch held it (connected, no gaps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({t for m in metrics for t in m.get("reward_per_task", {})})
    if not tasks:
        return None
    rows = (len(tasks) + columns - 1) // columns
    fig, axes = plt.subplots(
        rows, columns, figsize=(2.4 * columns, 1.7 * rows), dpi=90, sharex=True, sharey=True, squeeze=False
    )
    for ax, task in zip(axes.flat, tasks):
        points = [(m["step"], m["reward_per_task"][task]) for m in metrics if task in m.get("reward_per_task", {})]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
        ax.set_title(task if len(task) <= 28 else task[:26] + "…", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    fig.tight_layout()
    return _figure_png(fig)


def _number(value: Any) -> Any:
    """CSV cells as numbers where they are numbers."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return value
    return value


def _table(rows: list[dict], columns: list[str]) -> str:
    def cell(value: Any) -> str:
        value = _number(value)
        if isinstance(value, float):
            return "–" if value != value else f"{value:.4f}"  # NaN: not defined (a single sample)
        return html.escape(str(value))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(row.get(c, ''))}</td>" for c in columns) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _videos(table: list[dict], videos: dict[str, list[str]], limit: int = 4) -> str:
    """A few evaluation videos, base beside trained, linked relative to the report."""
    cells = []
    for task in [row["task"] for row in table if row["task"] != "ALL"][:limit]:
        pair = [p for variant in ("base", "trained") for p in videos.get(variant, []) if f"/{task}/" in p][:2]
        tags = "".join(
            f"<figure><video src='{html.escape(p)}' controls muted loop width='256'></video>"
            f"<figcaption>{html.escape(p.split('/')[-3])}</figcaption></figure>"
            for p in pair
        )
        cells.append(f"<div class='videos'><h3>{html.escape(task)}</h3>{tags}</div>")
    return "".join(cells)


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
code { font-size: 0.85em; }
.warn { color: #a40; }
.videos { display: inline-block; vertical-align: top; margin-right: 1em; }
.videos figure { display: inline-block; margin: 0 0.5em 0 0; }
"""


def _float(text: str) -> float:
    """A CSV cell as a number; empty (an interval of one sample) is NaN."""
    return float(text) if text != "" else float("nan")


def matrix_png(matrix: list[dict]) -> str:
    """Overall mean per sampler, one bar per model, with the 95 % bootstrap interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = [row for row in matrix if row["domain"] == "overall"]
    models = list(dict.fromkeys(row["model"] for row in overall))
    samplers = list(dict.fromkeys(row["sampler"] for row in overall))
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(samplers) * len(models) / 2 + 2), 3.2))
    for k, model in enumerate(models):
        rows = {row["sampler"]: row for row in overall if row["model"] == model}
        means = [float(rows[s]["mean"]) for s in samplers]
        low = [_float(rows[s]["mean"]) - _float(rows[s]["ci_low"]) for s in samplers]
        high = [_float(rows[s]["ci_high"]) - _float(rows[s]["mean"]) for s in samplers]
        xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(samplers))]
        ax.bar(xs, means, width, yerr=[low, high], capsize=3, label=model)
    ax.set_xticks(range(len(samplers)), samplers)
    ax.set_ylabel("mean score (overall)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _figure_png(fig)


def _matrix_pivot(matrix: list[dict]) -> tuple[list[dict], list[str]]:
    """Overall `mean [ci_low, ci_high]` per model (rows) and sampler (columns), formatted to three decimals."""
    overall = [row for row in matrix if row["domain"] == "overall"]
    samplers = list(dict.fromkeys(row["sampler"] for row in overall))
    rows = []
    for model in dict.fromkeys(row["model"] for row in overall):
        cells = {row["sampler"]: row for row in overall if row["model"] == model}
        rows.append(
            {
                "model": model,
                **{
                    s: f"{_float(c['mean']):.3f} [{_float(c['ci_low']):.3f}, {_float(c['ci_high']):.3f}]"
                    for s, c in cells.items()
                },
            }
        )
    return rows, ["model", *samplers]


def render_html(
    provenance: dict[str, Any],
    metrics: list[dict],
    table: list[dict],
    videos: dict[str, list[str]] | None = None,
    matrix: list[dict] | None = None,
) -> str:
    """The report page. `videos`: per variant, paths of evaluation videos relative to the report; `matrix`: the
    evaluation matrix's rows (matrix.csv)."""
    git = provenance["git"]
    dirty = ' <span class="warn">(uncommitted changes)</span>' if git.get("dirty") else ""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>videogrpo {html.escape(provenance['run_id'])}"
        f"</title><style>{STYLE}</style></head><body>",
        f"<h1>Run {html.escape(provenance['run_id'])}</h1>",
        f"<p>Workflow commit <code>{html.escape(str(git.get('commit')))}</code>{dirty}; "
        f"report generated {html.escape(provenance['generated_at'])}.</p>",
    ]
    if not metrics:
        parts.append("<p class='warn'>No training metrics were recorded for this run.</p>")
    else:
        parts.append("<h2>Reward during training</h2>")
        parts.append(f"<img alt='reward curve' src='data:image/png;base64,{reward_curve_png(metrics)}'>")
        if (per_task := per_task_curves_png(metrics)) is not None:
            parts.append("<h3>Per task (each panel: the updates whose batch held the task)</h3>")
            parts.append(f"<img alt='reward per task' src='data:image/png;base64,{per_task}'>")
        columns = [
            "step",
            "reward_mean",
            "reward_std",
            "policy_loss",
            "ppo_ratio_mean",
            "ppo_clip_fraction",
            "grad_norm",
            "learning_rate",
            "time_step_s",
        ]
        parts.append(_table(metrics, columns))
    parts.append("<h2>Evaluation: trained against base, same samples and noise (evaluate.split)</h2>")
    if table:
        parts.append(
            "<p>Mean EvalKit score per task, its standard error (<code>_se</code>), and <code>delta</code> = trained "
            "minus base with a 95 % paired bootstrap interval (<code>delta_ci_low</code>, <code>delta_ci_high</code>)."
            "</p>"
        )
        parts.append(_table(table, list(table[0].keys())))
        parts.append(_videos(table, videos or {}))
    else:
        parts.append("<p class='warn'>No evaluation table.</p>")
    if matrix:
        parts.append("<h2>Evaluation matrix (matrix.models x matrix.samplers, the evaluation set)</h2>")
        parts.append(
            "<p>Overall mean EvalKit score of each cell with its 95 % bootstrap interval over samples; below, every "
            "domain, and each model's paired change from the base model under the same sampler "
            "(<code>delta_vs_base</code>).</p>"
        )
        pivot, columns = _matrix_pivot(matrix)
        parts.append(_table(pivot, columns))
        parts.append(f"<img alt='evaluation matrix' src='data:image/png;base64,{matrix_png(matrix)}'>")
        parts.append(_table(matrix, list(matrix[0].keys())))
    parts.append("<h2>Stages</h2>")
    parts.append(
        _table(
            [{"stage": name, **t} for name, t in provenance["timings"].items()],
            ["stage", "started_at", "duration_s", "host", "slurm_job_id"],
        )
    )
    parts.append("<h2>Artifact digests (SHA-256)</h2>")
    parts.append(
        _table([{"artifact": k, **v} for k, v in provenance["digests"].items()], ["artifact", "path", "sha256", "size"])
    )
    parts.append("<h2>Software</h2>")
    parts.append(
        _table([{"package": k, "version": v} for k, v in provenance["versions"].items()], ["package", "version"])
    )
    parts.append("<h2>Configuration</h2>")
    parts.append(f"<pre>{html.escape(json.dumps(provenance['config'], indent=2, sort_keys=True))}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
