"""The run report: every stage manifest merged into provenance.json, and a readable HTML page."""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path
from typing import Any

from videogrpo.config import options_on
from videogrpo.provenance import cost_page, gold_page, metric_rows, page_cells, trace
from videogrpo.provenance.manifest import now_iso, read_manifest, record_digest

VALIDATION_MEAN = metric_rows.VALIDATION_PREFIX + "reward_mean"
VALIDATION_PROMPTS = metric_rows.VALIDATION_PREFIX + "prompts"


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
                "slurm_job": m.get("slurm_job"),
            }
            for name, m in stages.items()
        },
        # The jobs' final states from sacct where it answers: every job this report reads has ended.
        "cost": {"jobs": (jobs := trace.rows_of(stages)), "totals": trace.totals(jobs)},
        "stages": stages,
    }


def _figure_png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _updates_axis(ax) -> None:
    """Updates are counted: ticks at whole updates only (matplotlib's default puts them at 1.5, 2.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def reward_curve_figure(metrics: list[dict]):
    """The mean reward per update with its spread (one standard deviation over all rollouts); with validation
    during training, the held-out prompts' mean reward at each validation point as a second series."""
    plt = _pyplot()
    training, validation = metric_rows.training_rows(metrics), metric_rows.validation_rows(metrics)
    steps = [m["step"] for m in training]
    mean = [m["reward_mean"] for m in training]
    std = [m["reward_std"] for m in training]
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    ax.fill_between(steps, [a - b for a, b in zip(mean, std)], [a + b for a, b in zip(mean, std)], alpha=0.2)
    ax.plot(steps, mean, marker="o", markersize=3, linewidth=2, label="mean reward (band: ±1 std)")
    if validation:
        prompts = validation[-1][VALIDATION_PROMPTS]
        ax.plot(
            [m["step"] for m in validation],
            [m[VALIDATION_MEAN] for m in validation],
            marker="s",
            markersize=5,
            linewidth=1.5,
            linestyle="--",
            label=f"validation: mean reward of {prompts} held-out prompts, fixed noise",
        )
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("reward")
    _updates_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def reward_curve_png(metrics: list[dict]) -> str:
    return _figure_png(reward_curve_figure(metrics))


def wrap_name(name: str, width: int) -> str:
    """A task name on lines of at most `width` characters, broken only after a '_' (the whole name stays readable:
    VBVR task names run to 70 characters; a hyphen joins the parts of one word, `G-18`, `data-generator`)."""
    lines: list[str] = []
    for piece in re.findall(r"[^_]*_|[^_]+$", name):
        if lines and len(lines[-1]) + len(piece) <= width:
            lines[-1] += piece
        else:
            lines.append(piece)
    # A run without a break point longer than a line: cut it.
    return "\n".join(line[i : i + width] for line in lines for i in range(0, len(line), width))


def per_task_curves_figure(metrics: list[dict], columns: int = 5):
    """One small panel per task: its mean reward at the updates whose batch held it (connected, no gaps)."""
    plt = _pyplot()
    tasks = sorted({t for m in metrics for t in m.get("reward_per_task", {})})
    if not tasks:
        return None
    columns = min(columns, len(tasks))
    rows = (len(tasks) + columns - 1) // columns
    fig, axes = plt.subplots(
        rows, columns, figsize=(2.4 * columns, 1.9 * rows), dpi=90, sharex=True, sharey=True, squeeze=False
    )
    for ax, task in zip(axes.flat, tasks):
        points = [(m["step"], m["reward_per_task"][task]) for m in metrics if task in m.get("reward_per_task", {})]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
        ax.set_title(wrap_name(task, 36), fontsize=7)
        ax.tick_params(labelsize=6)
        _updates_axis(ax)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def per_task_curves_png(metrics: list[dict], columns: int = 5) -> str | None:
    fig = per_task_curves_figure(metrics, columns)
    return None if fig is None else _figure_png(fig)


LOCAL_TITLE = "not run inside a SLURM job (SLURM_JOB_ID was unset): it ran on the host named, outside SLURM"
UNCONFIRMED_TITLE = (
    "its environment held SLURM_JOB_ID={claimed}, but SLURM did not confirm that it ran in that job (the stage's "
    "manifest says why): counted as run outside SLURM, on the host named"
)


def slurm_job_cell(job_id: Any, claimed: Any = None) -> str:
    """A stage's SLURM job id, or `local` (with a tooltip saying so) for a stage that ran outside SLURM, where a
    SLURM_JOB_ID that SLURM did not confirm is named as such."""
    if job_id is None or job_id == "":
        if claimed:
            title, shown = UNCONFIRMED_TITLE.format(claimed=claimed), html.escape(str(claimed))
            return f"<span title='{html.escape(title)}'>local (SLURM_JOB_ID {shown} unconfirmed)</span>"
        return f"<span title='{html.escape(LOCAL_TITLE)}'>local</span>"
    return html.escape(str(job_id))


def commit_text(commit: Any) -> str:
    """The workflow commit the stages recorded: one, several (stages ran at different commits) or none."""
    if not commit:
        return "unknown (the workflow directory was not a git checkout)"
    if isinstance(commit, list):
        return "differs between stages: " + ", ".join(f"<code>{html.escape(c)}</code>" for c in commit)
    return f"<code>{html.escape(str(commit))}</code>"


def video_pairs(
    videos: dict[str, list[str]], tasks: int = 6, per_task: int = 2
) -> tuple[list[tuple[str, str, str, str]], int]:
    """(task, sample, base video, trained video) for the samples that both variants generated, the first
    `per_task` samples of each of the first `tasks` tasks; and the number of pairs there are in all. Videos are
    `<variant>/<task>/<sample>.mp4`: the same task and sample under both variants is the same prompt, first
    frame and noise."""

    def keyed(paths: list[str]) -> dict[tuple[str, str], str]:
        return {(Path(p).parent.name, Path(p).stem): p for p in paths}

    base, trained = keyed(videos.get("base", [])), keyed(videos.get("trained", []))
    common = sorted(base.keys() & trained.keys())
    shown: list[tuple[str, str, str, str]] = []
    per: dict[str, int] = {}
    for task, sample in common:
        if per.get(task, 0) < per_task and (task in per or len(per) < tasks):
            per[task] = per.get(task, 0) + 1
            shown.append((task, sample, base[(task, sample)], trained[(task, sample)]))
    return shown, len(common)


def _videos(videos: dict[str, list[str]], posters: dict[str, str] | None = None) -> str:
    """Base beside trained for the same samples, one row per sample, linked relative to the report; `posters`: a
    shown video's path -> the image it shows before it plays (its last frame, what the EvalKit scores)."""
    pairs, total = video_pairs(videos)
    if not pairs:
        return "<p class='warn'>No evaluation videos of both base and trained to show.</p>"
    posters = posters or {}

    def video(path: str, variant: str, task: str, sample: str) -> str:
        poster = f"poster='{html.escape(posters[path])}' " if path in posters else ""
        return (
            f"<td><video src='{html.escape(path)}' {poster}controls muted loop width='256' preload='metadata' "
            f"data-variant='{variant}' data-task='{html.escape(task)}' data-sample='{html.escape(sample)}'>"
            f"</video></td>"
        )

    rows = "".join(
        f"<tr><th scope='row'>{html.escape(task)}<br><code>{html.escape(sample)}</code></th>"
        f"{video(base, 'base', task, sample)}{video(trained, 'trained', task, sample)}</tr>"
        for task, sample, base, trained in pairs
    )
    note = (
        f"{len(pairs)} of {total} samples shown; all are in the two cells' <code>prepared/</code> folders."
        if total > len(pairs)
        else ""
    )
    return (
        "<h3>Videos: base and trained, same sample and noise</h3>"
        f"<table class='videos'><thead><tr><th>task / sample</th><th>base</th><th>trained</th></tr></thead>"
        f"<tbody>{rows}</tbody></table><p>{note}</p>"
    )


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
/* Names and paths break only after a separator (breakable); a digest, one token, anywhere. */
table.digests { width: 100%; }
table.digests td { overflow-wrap: normal; }
table.digests td:nth-child(3) { word-break: break-all; }
table.digests td:last-child { white-space: nowrap; }
table.data { width: 100%; }
table.data td { overflow-wrap: anywhere; }
table.videos th[scope=row] { max-width: 20em; font-weight: normal; overflow-wrap: anywhere; }
/* The held-out check's table: its first column, the task, wraps (VBVR task names run to 70 characters). */
div.fit td:first-child { overflow-wrap: anywhere; }
div.verdict { border: 2px solid #4a7; border-radius: 6px; padding: 0.2em 1em; margin: 1em 0; background: #f6fbf7; }
p.ok { color: #275; font-weight: bold; }
img { max-width: 100%; height: auto; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; }
code { font-size: 0.85em; }
.warn { color: #a40; }
"""


def matrix_png(matrix: list[dict]) -> str:
    """Overall mean per sampler, one bar per model, with the 95 % bootstrap interval."""
    plt = _pyplot()
    overall = [row for row in matrix if row["domain"] == "overall"]
    models = list(dict.fromkeys(row["model"] for row in overall))
    samplers = list(dict.fromkeys(row["sampler"] for row in overall))
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(samplers) * len(models) / 2 + 2), 3.2))
    missing = {"mean": "", "ci_low": "", "ci_high": ""}  # a model without a cell under a sampler: no bar there
    for k, model in enumerate(models):
        rows = {row["sampler"]: row for row in overall if row["model"] == model}
        cells = [rows.get(s, missing) for s in samplers]
        means = [page_cells.csv_float(c["mean"]) for c in cells]
        low = [page_cells.csv_float(c["mean"]) - page_cells.csv_float(c["ci_low"]) for c in cells]
        high = [page_cells.csv_float(c["ci_high"]) - page_cells.csv_float(c["mean"]) for c in cells]
        xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(samplers))]
        ax.bar(xs, means, width, yerr=[low, high], capsize=3, label=model)
    ax.set_xticks(range(len(samplers)), samplers)
    ax.set_ylabel("mean score (overall)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _figure_png(fig)


CHECK_CHANGE = "trained - base [95 % paired interval]"


def _number_text(text: str) -> str:
    """A CSV number to four decimals; empty or NaN (no interval below two samples) as a dash."""
    value = page_cells.csv_float(text)
    return "–" if value != value else page_cells.fixed(value)


def _change_text(trained: dict) -> str:
    """The trained model's paired change from the base with its interval: `delta [ci_low, ci_high]`."""
    low, high = (_number_text(trained[k]) for k in ("delta_ci_low", "delta_ci_high"))
    return f"{_number_text(trained['delta_vs_base'])} [{low}, {high}]"


def check_pivot(check: list[dict]) -> tuple[list[dict], list[str]]:
    """The held-out check per task (ALL last), from its rows of the per-task table: each model's `mean ± se` and the
    trained model's paired change from the base, `delta [ci_low, ci_high]`."""
    models = list(dict.fromkeys(row["model"] for row in check))
    by_cell = {(row["task"], row["model"]): row for row in check}
    rows = []
    for task in dict.fromkeys(row["task"] for row in check):
        found = {model: by_cell[(task, model)] for model in models if (task, model) in by_cell}
        row = {"task": task, "samples": next(iter(found.values()))["samples"]}
        for model in models:
            cell = found.get(model)
            row[model] = f"{_number_text(cell['mean'])} ± {_number_text(cell['se'])}" if cell else ""
        trained = found.get("trained", {})
        if trained.get("delta_vs_base", ""):
            row[CHECK_CHANGE] = _change_text(trained)
        rows.append(row)
    return rows, ["task", "samples", *models, *([CHECK_CHANGE] if any(CHECK_CHANGE in r for r in rows) else [])]


def _matrix_pivot(matrix: list[dict]) -> tuple[list[dict], list[str]]:
    """Overall `mean [ci_low, ci_high]` per model (rows) and sampler (columns), formatted to three decimals."""
    overall = [row for row in matrix if row["domain"] == "overall"]
    samplers = list(dict.fromkeys(row["sampler"] for row in overall))
    rows = []
    for model in dict.fromkeys(row["model"] for row in overall):
        cells = {row["sampler"]: row for row in overall if row["model"] == model}
        shown = {
            s: [page_cells.fixed(page_cells.csv_float(c[k]), 3) for k in ("mean", "ci_low", "ci_high")]
            for s, c in cells.items()
        }
        shown_text = {s: f"{mean} [{low}, {high}]" for s, (mean, low, high) in shown.items()}
        rows.append({"model": model, **{s: shown_text.get(s, "–") for s in samplers}})  # "–": no such cell
    return rows, ["model", *samplers]


def _verdict_word(low: float, high: float) -> str:
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "no clear difference (the interval holds 0)" if low == low else "too few samples for an interval"


def verdict_rows(matrix: list[dict], check_sampler: str) -> list[dict]:
    """Trained against base under the training sampler, overall first and then per domain, from matrix.csv: each
    model's mean, the paired change with its 95 % interval, and what the interval says."""
    cells = {(row["model"], row["domain"]): row for row in matrix if row["sampler"] == check_sampler}
    domains = sorted({domain for model, domain in cells if model == "trained"}, key=lambda d: (d != "overall", d))
    rows = []
    for domain in domains:
        trained, base = cells[("trained", domain)], cells.get(("base", domain))
        row = {"domain": domain, "samples": trained["samples"], "trained": _number_text(trained["mean"])}
        row["base"] = _number_text(base["mean"]) if base else "–"
        if trained.get("delta_vs_base", ""):
            row[CHECK_CHANGE] = _change_text(trained)
            row["verdict"] = _verdict_word(
                page_cells.csv_float(trained["delta_ci_low"]), page_cells.csv_float(trained["delta_ci_high"])
            )
        rows.append(row)
    return rows


def reward_label(reward: dict[str, Any]) -> str:
    """reward.kind, or its terms with their weights (reward.terms: several rewards, weighted)."""
    terms = reward.get("terms") or {}
    return " + ".join(f"{weight:g} x {kind}" for kind, weight in sorted(terms.items())) or str(reward.get("kind", "?"))


def recipe_summary(config: dict[str, Any], updates: int | None) -> str:
    """One line of what was trained and how: the recipe and the settings a reader compares runs by."""
    g, p, t, m, r = (config.get(k, {}) for k in ("grpo", "parallel", "train", "model", "reward"))
    eta = f"eta in {g['eta_range']}" if g.get("eta_range") else f"eta {g.get('eta')}"
    layout = html.escape(str(p.get("data_parallel", "?")))
    if (p.get("tensor_parallel") or 1) > 1:
        layout += f", tensor parallel {p['tensor_parallel']}"
    parts = [
        f"recipe <b>{html.escape(str(config.get('recipe', '?')))}</b>",
        f"model {html.escape(str(m.get('repo_id') if m.get('source') == 'hub' else m.get('source', '?')))}"
        f" ({html.escape(str(m.get('kind', '?')))})",
        f"reward {html.escape(reward_label(r))}",
        f"sampler {html.escape(str(g.get('sampler', '?')))}, {html.escape(eta)}",
        f"{g.get('prompts_per_step', '?')} prompts x group {g.get('group_size', '?')} per update",
        f"lr {t.get('lr', '?')}",
        f"{updates if updates is not None else '?'} updates",
        f"{p.get('nodes', '?')} node(s) x {p.get('procs_per_node', '?')} processes ({layout})",
    ]
    if on := options_on({k: v for k, v in config.items() if isinstance(v, dict)}):
        # Options beyond the reference (docs/options.md): a reader comparing runs must see them.
        parts.append("options " + ", ".join(f"{html.escape(k)} = {html.escape(json.dumps(v))}" for k, v in on.items()))
    return "; ".join(parts)


def run_status(provenance: dict[str, Any]) -> tuple[str, bool]:
    """What the run's stage jobs came to: (a sentence, whether all of them completed)."""
    jobs = (provenance.get("cost") or {}).get("jobs") or []
    failed = [job for job in jobs if job.get("state", "COMPLETED") != "COMPLETED"]
    if not jobs:
        return "no stage job recorded its cost", False
    if failed:
        names = ", ".join(f"{job.get('stage')} ({job.get('state')})" for job in failed)
        return f"{len(failed)} of {len(jobs)} stage jobs did not complete: {names}", False
    return f"complete: the {len(jobs)} stage jobs before this report all completed", True


def render_html(
    provenance: dict[str, Any],
    metrics: list[dict],
    check: list[dict],
    videos: dict[str, list[str]] | None = None,
    matrix: list[dict] | None = None,
    check_sampler: str = "",
    posters: dict[str, str] | None = None,
    refiners: str = "",
) -> str:
    """The report page. `check`: the held-out check's rows of the matrix's per-task table (the trained and base
    model under the training sampler, `check_sampler`); `videos`: per model (`base`, `trained`), paths of the
    check's videos relative to the report; `matrix`: the evaluation matrix's rows (matrix.csv); `refiners`: the
    prompt refiners' section (refiner_page), after the matrix."""
    git = provenance["git"]
    dirty = ' <span class="warn">(uncommitted changes)</span>' if git.get("dirty") else ""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>videogrpo {html.escape(provenance['run_id'])}"
        f"</title><style>{STYLE}{cost_page.STYLE}</style></head><body>",
        f"<h1>Run {html.escape(provenance['run_id'])}</h1>",
        f"<p>Workflow commit {commit_text(git.get('commit'))}{dirty}; "
        f"report generated {html.escape(provenance['generated_at'])}.</p>",
    ]
    # The first screen: the verdict, what was trained, and whether the run is whole; the evidence follows.
    status, whole = run_status(provenance)
    updates = max((int(m["step"]) for m in metric_rows.training_rows(metrics) if "step" in m), default=None)
    parts.append("<div class='verdict'>")
    parts.append(f"<p class='{'ok' if whole else 'warn'}'>Run status: {html.escape(status)}.</p>")
    parts.append(gold_page.first_screen(metric_rows.validation_rows(metrics)))  # did the divergence alarm fire
    verdict = verdict_rows(matrix or [], check_sampler) if check_sampler else []
    if verdict:
        parts.append(
            f"<p><b>Trained against base</b> under the training sampler (<code>{html.escape(check_sampler)}</code>), "
            "mean EvalKit score on the run's evaluation set and the paired change with its 95 % bootstrap interval:</p>"
        )
        columns = [
            "domain",
            "samples",
            "trained",
            "base",
            *([CHECK_CHANGE, "verdict"] if any("verdict" in r for r in verdict) else []),
        ]
        parts.append(page_cells.table(verdict, columns))
    else:
        parts.append("<p class='warn'>No trained-against-base comparison in the matrix.</p>")
    parts.append(
        f"<p>{recipe_summary(provenance.get('config') or {}, updates)}. The full configuration is at the end.</p>"
    )
    parts.append("</div>")
    if not metrics:
        parts.append("<p class='warn'>No training metrics were recorded for this run.</p>")
    else:
        parts.append("<h2>Reward during training</h2>")
        parts.append(f"<img alt='reward curve' src='data:image/png;base64,{reward_curve_png(metrics)}'>")
        if (per_task := per_task_curves_png(metrics)) is not None:
            parts.append("<h3>Per task (each panel: the updates whose batch held the task)</h3>")
            parts.append(f"<img alt='reward per task' src='data:image/png;base64,{per_task}'>")
        trained = metric_rows.training_rows(metrics)
        # GRPO's ratio diagnostics, or DiffusionNFT's (grpo.algorithm nft: no ratio)
        nft_run = bool(trained) and "nft_optimality_mean" in trained[0]
        objective = ["nft_optimality_mean", "nft_negative_loss"] if nft_run else ["ppo_ratio_mean", "ppo_clip_fraction"]
        columns = ["step", "reward_mean", "reward_std", "policy_loss", *objective, "grad_norm", "learning_rate"]
        parts.append(
            page_cells.table(trained, [*columns, "time_step_s"], {"learning_rate": page_cells.learning_rate_text})
        )
        if validated := metric_rows.validation_rows(metrics):
            parts.append(
                "<h3>Validation during training: held-out prompts with fixed noise (the dashed series above)</h3>"
            )
            columns = ["step", "val/reward_mean", "val/reward_std", "val/prompts", "val/reward_errors", "val/time_s"]
            parts.append(page_cells.table(validated, columns))
            parts.append(gold_page.section(validated, _figure_png, _pyplot, _updates_axis, wrap_name, page_cells.table))
    under = f" (<code>{html.escape(check_sampler)}</code>)" if check_sampler else ""
    parts.append(f"<h2>Held-out check: trained against base under the training sampler{under}</h2>")
    if check:
        parts.append(
            "<p>The two cells of the evaluation matrix that sample as training does, on the run's evaluation set, "
            "from their rows of the matrix's per-task table (<code>matrix/per_task.csv</code>, which also holds the "
            "bootstrap intervals of the means): the mean EvalKit score per task and over ALL samples with its "
            "standard error, and trained minus base on the same samples and noise with its 95 % paired bootstrap "
            "interval.</p>"
        )
        pivot, columns = check_pivot(check)
        parts.append(f"<div class='fit'>{page_cells.table(pivot, columns)}</div>")
        parts.append(_videos(videos or {}, posters))
    else:
        parts.append("<p class='warn'>No held-out check in the matrix's per-task table.</p>")
    if matrix:
        parts.append("<h2>Evaluation matrix (matrix.models x matrix.samplers, the evaluation set)</h2>")
        parts.append(
            "<p>Overall mean EvalKit score of each cell with its 95 % bootstrap interval over samples; below, every "
            "domain, and each model's paired change from the base model under the same sampler "
            "(<code>delta_vs_base</code>).</p>"
        )
        pivot, columns = _matrix_pivot(matrix)
        parts.append(page_cells.table(pivot, columns))
        parts.append(f"<img alt='evaluation matrix' src='data:image/png;base64,{matrix_png(matrix)}'>")
        parts.append(page_cells.table(matrix, list(matrix[0].keys()), css="data"))
    parts.append(refiners)
    parts.append("<h2>Stages: what each job cost</h2>")
    parts.append(
        "<p>One row per stage job, by start (UTC): <code>job id</code> is the SLURM job the stage ran in, "
        "<code>local</code> a stage that ran outside SLURM, on the host named; <code>state</code> is sacct's final "
        "state where sacct answered, else COMPLETED (a stage writes its manifest only when it succeeds). CPU-h: "
        "the stage's process and the children it waited for (torchrun's ranks; not those srun starts for a "
        "multi-node SLURM training); GPU-h: GPUs x wall "
        "hours (training: nodes x GPUs per node). The timeline below puts every job on one time axis.</p>"
    )
    cost = provenance.get("cost") or {"jobs": [], "totals": None}
    if cost["jobs"]:
        parts.append(cost_page.cost_table(cost["jobs"], cost["totals"], slurm_job_cell))
        parts.append("<h3>Timeline</h3>")
        parts.append(cost_page.timeline(cost["jobs"]))
    parts.append("<h2>Artifact digests (SHA-256)</h2>")
    parts.append(
        page_cells.table(
            [{"artifact": k, **v} for k, v in provenance["digests"].items()],
            ["artifact", "path", "sha256", "size"],
            {
                "artifact": page_cells.breakable,
                "path": page_cells.breakable,
                "sha256": lambda d: f"<code>{html.escape(str(d))}</code>",
            },
            css="digests",
        )
    )
    parts.append("<h2>Software</h2>")
    parts.append(
        page_cells.table(
            [{"package": k, "version": v} for k, v in provenance["versions"].items()], ["package", "version"]
        )
    )
    parts.append("<h2>Configuration</h2>")
    parts.append(f"<pre>{html.escape(json.dumps(provenance['config'], indent=2, sort_keys=True))}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
