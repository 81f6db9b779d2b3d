"""The report's view of the prompt refiners (the `refiners` section): each refiner's training (its loss, advantage,
gradient norm, fallbacks and weight version per update), what each part contributed on the evaluation set (the
matrix's paired changes between the generator alone, behind the refiners it started from and behind the trained
ones, with their 95 % intervals), and a sample of rewrites beside the videos they made.

Everything is read from metrics.jsonl, the matrix's table (matrix.csv) and the `refined` cell's rewrites; the
report stage hands in the rows.

May import: `page_cells` and the core modules.
"""

from __future__ import annotations

import html

from videogrpo.provenance import page_cells

CONTRIBUTIONS = (
    ("trained", "base", "the generator's training (trained - base)"),
    ("base_refiners", "trained", "the refiners it started from (base_refiners - trained)"),
    ("refined", "trained", "the trained refiners (refined - trained)"),
    ("refined", "base_refiners", "the refiners' training (refined - base_refiners)"),
)
"""(model, against, what the paired change measures): the matrix's columns delta_vs_<against> of the model's row."""


def refiner_names(metrics: list[dict]) -> list[str]:
    names = {key.split("/")[1] for row in metrics for key in row if key.startswith("refiner/") and key.count("/") == 2}
    return sorted(names)


def contributions(matrix: list[dict]) -> list[dict]:
    """One row per (sampler, contribution) the matrix holds: the paired change over the evaluation set with its
    interval."""
    rows = []
    overall = [row for row in matrix if row.get("domain") == "overall"]
    for model, against, what in CONTRIBUTIONS:
        column = "delta_vs_base" if against == "base" else f"delta_vs_{against}"
        low, high = (
            ("delta_ci_low", "delta_ci_high") if against == "base" else (f"{column}_ci_low", f"{column}_ci_high")
        )
        for row in overall:
            if row["model"] == model and row.get(column) not in (None, ""):
                change = f"{float(row[column]):+.4f} [{float(row[low]):+.4f}, {float(row[high]):+.4f}]"
                rows.append({"contribution": what, "sampler": row["sampler"], "paired change [95 % interval]": change})
    return rows


def section(metrics: list[dict], matrix: list[dict], samples: list[dict]) -> str:
    """The report's prompt-refiner section; "" for a run without refiners. `samples`: rewrites beside their videos,
    each {task, sample, original, rewrite, fallback, refined, trained} (the last two: video paths relative to the
    page)."""
    names = refiner_names(metrics)
    if not names:
        return ""
    parts = ["<h2>Prompt refiners</h2>"]
    for name in names:
        p = f"refiner/{name}/"
        columns = ["step", *(p + k for k in ("loss", "advantage_abs_mean", "grad_norm", "kl", "rewrites"))]
        columns += [p + "fallback_cut", p + "fallback_unparsed", p + "version", p + "flops_per_update"]
        columns += ["model_flops_per_update"]  # the generator's, beside
        rows = [row for row in metrics if p + "loss" in row]
        parts.append(f"<h3>Refiner <code>{html.escape(name)}</code> during training</h3>")
        parts.append(page_cells.table(rows, columns))
    found = contributions(matrix)
    parts.append("<h3>What each part contributed on the evaluation set</h3>")
    if found:
        parts.append(
            "<p>Paired over the same samples and noise (matrix.csv's <code>delta_vs_*</code> columns): the trained "
            "generator alone (<code>trained</code>), behind the refiners it started from (<code>base_refiners</code>) "
            "and behind the trained refiners (<code>refined</code>).</p>"
        )
        parts.append(page_cells.table(found, ["contribution", "sampler", "paired change [95 % interval]"]))
    else:
        parts.append(
            "<p class='warn'>The matrix holds no refiner cells: list <code>refined</code> and "
            "<code>base_refiners</code> in matrix.models to measure them.</p>"
        )
    if samples:
        parts.append("<h3>Rewrites beside their videos (the held-out check's sampler)</h3>")
        parts.append(_sample_table(samples))
    return "\n".join(parts)


def _sample_table(samples: list[dict]) -> str:
    def video(path: str) -> str:
        return f"<td><video src='{html.escape(path)}' controls muted loop width='192' preload='metadata'></video></td>"

    rows = "".join(
        f"<tr><th scope='row'>{html.escape(s['task'])}<br><code>{html.escape(s['sample'])}</code></th>"
        f"<td>{html.escape(s['original'])}</td><td>{html.escape(s['rewrite'])}"
        f"{'' if not s['fallback'] else ' <span class=warn>(fell back: ' + html.escape(s['fallback']) + ')</span>'}"
        f"</td>{video(s['trained'])}{video(s['refined'])}</tr>"
        for s in samples
    )
    head = "<th>task / sample</th><th>prompt</th><th>rewrite</th><th>trained, own prompt</th><th>refined</th>"
    return f"<table class='videos'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
