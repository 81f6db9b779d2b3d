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
        "config": {k: v for manifest in stages.values() for k, v in manifest["params"].items()},
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


def reward_curve_png(metrics: list[dict]) -> str:
    """The reward curve (mean and per task) as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
    ax.plot(steps, [m["reward_mean"] for m in metrics], marker="o", linewidth=2, label="mean reward")
    tasks = sorted({t for m in metrics for t in m.get("reward_per_task", {})})
    for task in tasks:
        ax.plot(steps, [m["reward_per_task"].get(task) for m in metrics], linewidth=1, alpha=0.6, label=task)
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _table(rows: list[dict], columns: list[str]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        return html.escape(str(value))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(row.get(c, ''))}</td>" for c in columns) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
code { font-size: 0.85em; }
.warn { color: #a40; }
"""


def render_html(provenance: dict[str, Any], metrics: list[dict], table: list[dict]) -> str:
    git = provenance["git"]
    dirty = ' <span class="warn">(uncommitted changes)</span>' if git.get("dirty") else ""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>videogrpo {html.escape(provenance['run_id'])}"
        f"</title><style>{STYLE}</style></head><body>",
        f"<h1>Run {html.escape(provenance['run_id'])}</h1>",
        f"<p>Workflow commit <code>{html.escape(str(git.get('commit')))}</code>{dirty}; "
        f"report generated {html.escape(provenance['generated_at'])}.</p>",
        "<h2>Reward during training</h2>",
    ]
    if metrics:
        parts.append(f"<img alt='reward curve' src='data:image/png;base64,{reward_curve_png(metrics)}'>")
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
        parts.append(_table(table, list(table[0].keys())))
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
