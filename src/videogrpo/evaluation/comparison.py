"""The comparison page of several runs (`videogrpo compare`): runs that differ in their algorithm (or in any other
contract field) side by side. For each run: what it differs in from the others, its held-out change against the
base model with the paired 95 % interval (its matrix's rows), its reward per update and per modelled GPU-hour (the
FLOPs its metrics record over an assumed peak and MFU), and its wall time per update on the hardware it ran on. For
each run after the first, under every sampler all the runs' matrices evaluated their trained model with: the
paired difference from the first run's trained model, each sample against itself (the matrices must share their
evaluation set and generation settings, so the same prompt, first frame and noise), with a bootstrap interval.

Every file read is checked against the digest its stage's manifest records (the training metrics, the per-task
table, each cell's scores); a mismatch is an error naming the file.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from videogrpo.config.cells import training_sampler
from videogrpo.errors import VideoGRPOError
from videogrpo.evaluation.aggregate import ALL, bootstrap_interval
from videogrpo.provenance import digest, page_cells, report_page
from videogrpo.provenance.manifest import MODEL_INPUT, read_manifest
from videogrpo.provenance.metric_rows import training_rows


@dataclass
class RunRecord:
    """What the page reads of one run, each file's digest checked."""

    run_dir: Path
    params: dict[str, Any]
    """The train stage's view of the config: every contract field, by section."""
    metrics: list[dict]
    """Its training rows (one per optimizer update)."""
    check: dict[str, dict]
    """The per-task table's ALL rows, by (model, sampler) as `model:sampler`."""
    cells: dict[str, Path] = field(default_factory=dict)
    """Each scored cell's scores.csv, by `model:sampler`."""
    accelerator: str = "CPU"
    bootstrap: int = 200
    seed: int = 0
    preset: str = "-"
    """The algorithm preset (config/algorithms) whose every setting the run has, or "-"."""

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def check_sampler(self) -> str:
        """The held-out check's sampler: the one training rolls out with."""
        return training_sampler(SimpleNamespace(grpo=SimpleNamespace(**self.params["grpo"])))


def _checked(record: dict[str, Any], manifest: Path, what: str) -> Path:
    """The file a manifest records, after checking its digest against the record."""
    path = Path(record["path"])
    if not path.is_file():
        raise VideoGRPOError(f"{path}: the {what} {manifest} records is missing; rerun the run's workflow to make it")
    if digest.sha256_file(path) != record.get("sha256"):
        raise VideoGRPOError(
            f"{path}: its sha256 is not the one {manifest} records for the {what} (changed since it was made); "
            "rerun the run's workflow, or `videogrpo verify` the run to see every such file"
        )
    return path


def load_run(run_dir: Path, presets: dict[str, dict[str, Any]] | None = None) -> RunRecord:
    """A complete run's training metrics, held-out check and cells, each checked against its manifest's digest, and
    the algorithm preset it ran (`read_presets`)."""
    train_manifest, matrix_manifest = run_dir / "train.manifest.json", run_dir / "matrix.manifest.json"
    for path in (train_manifest, matrix_manifest):
        if not path.is_file():
            raise VideoGRPOError(
                f"{run_dir}: no {path.name}; compare takes runs that trained and evaluated (run the workflow to its "
                "report first)"
            )
    train, matrix = read_manifest(train_manifest), read_manifest(matrix_manifest)
    metrics_file = _checked(train["outputs"]["metrics"], train_manifest, "training metrics")
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line]
    per_task = _checked(matrix["outputs"]["per_task"], matrix_manifest, "per-task table")
    with open(per_task, newline="") as f:
        check = {f"{r['model']}:{r['sampler']}": r for r in csv.DictReader(f) if r["task"] == ALL}
    cells = {label: _checked(record, matrix_manifest, f"scores of cell {label}")
             for label, record in matrix["inputs"].items() if not label.startswith(MODEL_INPUT)}  # fmt: skip
    devices = (train.get("accelerator") or {}).get("devices") or []
    accelerator = devices[0] if devices else f"CPU ({train.get('host', 'unknown host')})"
    params = train["params"]
    matrix_params = params.get("matrix", {})
    return RunRecord(
        run_dir,
        params,
        training_rows(rows),
        check,
        cells,
        accelerator,
        int(matrix_params.get("bootstrap", 200)),
        int(matrix_params.get("seed", 0)),
        preset_of(params, presets or {}),
    )


def read_presets(folder: Path) -> dict[str, dict[str, Any]]:
    """The algorithm presets of `folder` (config/algorithms/*.yaml): each one's settings as `section.field` ->
    value, with those of the presets its header's command layers before it (mixgrpo_flash: mixgrpo's); none where
    the folder is missing."""
    import yaml

    paths = {path.stem: path for path in sorted(Path(folder).glob("*.yaml"))}
    own = {name: _flat(yaml.safe_load(path.read_text()) or {}) for name, path in paths.items()}
    found = {}
    for name, path in paths.items():
        command = next((line for line in path.read_text().splitlines() if "--configfile" in line), "")
        before = [Path(word).stem for word in command.split() if Path(word).parent.name == Path(folder).name]
        before += [] if name in before else [name]
        found[name] = {k: v for base in before if base in own for k, v in own[base].items()}
    return found


def preset_of(params: dict[str, Any], presets: dict[str, dict[str, Any]]) -> str:
    """The preset whose every setting the run's contract fields hold (a field its view leaves out, an option that is
    off, holds its default), the one with the most settings where several match; "-" for none."""
    from videogrpo.config import Config

    defaults, flat = _flat(dataclasses.asdict(Config())), _flat(params)

    def holds(key: str, value: Any) -> bool:
        have = flat.get(key, defaults.get(key))
        return json.dumps(have, sort_keys=True) == json.dumps(value, sort_keys=True) or (
            isinstance(have, (int, float)) and isinstance(value, (int, float)) and float(have) == float(value)
        )

    found = [name for name, fields in presets.items() if all(holds(k, v) for k, v in fields.items())]
    return max(found, key=lambda name: len(presets[name]), default="-")


def _flat(params: dict[str, Any]) -> dict[str, Any]:
    return {
        f"{section}.{name}": value
        for section, values in params.items()
        if isinstance(values, dict)
        for name, value in values.items()
    }


def shown(value: Any) -> str:
    """A field's value as the page shows it: text bare (euler, not "euler"), numbers, lists and mappings as in a
    config file's flow style ([0, 4], {a: 1}), nothing set as null."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in sorted(value.items())) + "}"
    return json.dumps(value)


def differing_fields(runs: list[RunRecord]) -> list[dict[str, str]]:
    """Per run, the contract fields whose value is not the same in every run: `section.field` -> value as shown."""
    flat = [_flat(r.params) for r in runs]
    # Compared as JSON: a text "1" and a number 1 differ, though both show as 1.
    keys = sorted({k for f in flat for k in f if len({json.dumps(g.get(k, "-"), sort_keys=True) for g in flat}) > 1})
    return [{k: shown(f[k]) if k in f else "-" for k in keys} for f in flat]


def _update_flops(run: RunRecord) -> np.ndarray:
    """Every FLOP each update's metrics record: its replay with gradients and its forwards without."""
    return np.array([r.get("model_flops_per_update", 0) + r.get("inference_flops_per_update", 0) for r in run.metrics])


def _gpu_hours(flops: np.ndarray | float, peak_flops: float, mfu: float) -> np.ndarray | float:
    return flops / (peak_flops * mfu) / 3600


# The training table's figures that span orders of magnitude (a tiny run's GPU-hours, a reward per GPU-hour): shown
# to significant digits, not to four decimals.
SIGNIFICANT = (
    "reward per update",
    "PFLOP per update",
    "modelled GPU-h",
    "reward per modelled GPU-h",
    "wall s per update",
)


def training_summary(run: RunRecord, peak_flops: float, mfu: float) -> dict[str, Any]:
    """Updates, reward, FLOPs, the modelled GPU-hours (every FLOP the run's updates record, at `mfu` of
    `peak_flops`) and the measured wall time per update."""
    rows = run.metrics
    if not rows:
        raise VideoGRPOError(f"{run.run_dir}: its training metrics hold no update")
    flops = _update_flops(run)
    hours = float(_gpu_hours(flops.sum(), peak_flops, mfu))
    first, last = rows[0]["reward_mean"], rows[-1]["reward_mean"]
    return {
        "run": run.name,
        "preset": run.preset,
        "updates": len(rows),
        "reward first": first,
        "reward last": last,
        "reward per update": (last - first) / max(1, len(rows) - 1),
        "PFLOP per update": float(np.mean(flops)) / 1e15,
        "modelled GPU-h": hours,
        "reward per modelled GPU-h": (last - first) / hours if hours > 0 else float("nan"),
        "wall s per update": float(np.mean([r["time_step_s"] for r in rows])),
        "hardware": run.accelerator,
    }


def heldout_rows(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """Each run's held-out change against the base under its training sampler, with the paired 95 % interval."""
    found = []
    for run in runs:
        sampler = run.check_sampler
        trained = run.check.get(f"trained:{sampler}")
        if trained is None:
            raise VideoGRPOError(f"{run.run_dir}: its per-task table has no trained:{sampler} row (the held-out check)")
        base = run.check.get(f"base:{sampler}", {})
        found.append(
            {
                "run": run.name,
                "sampler": sampler,
                "base": page_cells.csv_float(base.get("mean", "")),
                "trained": page_cells.csv_float(trained["mean"]),
                "trained - base": page_cells.csv_float(trained.get("delta_vs_base", "")),
                "95 % interval": _interval(trained.get("delta_ci_low", ""), trained.get("delta_ci_high", "")),
            }
        )
    return found


def _interval(low: Any, high: Any) -> str:
    return f"[{page_cells.fixed(page_cells.csv_float(str(low)))}, {page_cells.fixed(page_cells.csv_float(str(high)))}]"


def _scores(path: Path) -> dict[str, float]:
    with open(path, newline="") as f:
        return {row["name"]: float(row["score"]) for row in csv.DictReader(f)}


def paired_rows(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """Under every sampler all runs evaluated their trained model with: each later run's trained model minus the
    first run's, sample by sample, its mean and 95 % bootstrap interval (the first run's matrix.bootstrap and seed)."""
    first = runs[0]
    samplers = [label.partition(":")[2] for label in first.cells if label.startswith("trained:")]
    shared = [s for s in samplers if all(f"trained:{s}" in r.cells for r in runs)]
    found = []
    for sampler in shared:
        reference = _scores(first.cells[f"trained:{sampler}"])
        for run in runs[1:]:
            other = _scores(run.cells[f"trained:{sampler}"])
            if sorted(other) != sorted(reference):
                raise VideoGRPOError(
                    f"{run.cells[f'trained:{sampler}']} scored other samples than "
                    f"{first.cells[f'trained:{sampler}']}: the runs' matrices must share their evaluation set"
                )
            names = sorted(reference)
            deltas = np.array([other[n] - reference[n] for n in names])
            low, high = bootstrap_interval(deltas, first.bootstrap, first.seed)
            found.append(
                {
                    "sampler": sampler,
                    "run": run.name,
                    "against": first.name,
                    "samples": len(names),
                    "mean difference": float(deltas.mean()),
                    "95 % interval": _interval(low, high),
                }
            )
    return found


@dataclass
class Tables:
    """The page's numbers, computed once for the page and the printed summary."""

    heldout: list[dict[str, Any]]
    paired: list[dict[str, Any]]
    training: list[dict[str, Any]]


def tables(runs: list[RunRecord], peak_flops: float, mfu: float) -> Tables:
    return Tables(heldout_rows(runs), paired_rows(runs), [training_summary(r, peak_flops, mfu) for r in runs])


def summary_lines(found: Tables) -> list[str]:
    """The page's numbers as text: held-out changes, paired differences, training."""
    lines = [
        f"{r['run']}: held-out trained - base {r['trained - base']:+.4f} {r['95 % interval']} ({r['sampler']})"
        for r in found.heldout
    ]
    lines += [
        f"{r['run']} - {r['against']} ({r['sampler']}): {r['mean difference']:+.4f} {r['95 % interval']}"
        for r in found.paired
    ]
    for t in found.training:
        lines.append(f"{t['run']}: algorithm preset {t['preset']}")
        lines.append(
            f"{t['run']}: {t['updates']} updates, reward {t['reward first']:.4f} -> {t['reward last']:.4f}, "
            f"{t['modelled GPU-h']:.3g} modelled GPU-h, {t['wall s per update']:.2f} s per update ({t['hardware']})"
        )
    return lines


def curves_png(runs: list[RunRecord], peak_flops: float, mfu: float) -> str:
    """Reward per update and against the modelled GPU-hours so far, one line per run."""
    plt = report_page._pyplot()
    fig, (by_update, by_hours) = plt.subplots(1, 2, figsize=(11, 3.6), dpi=100)
    for run in runs:
        rewards = [r["reward_mean"] for r in run.metrics]
        hours = _gpu_hours(np.cumsum(_update_flops(run)), peak_flops, mfu)
        by_update.plot([r["step"] for r in run.metrics], rewards, marker="o", markersize=3, label=run.name)
        by_hours.plot(hours, rewards, marker="o", markersize=3, label=run.name)
    by_update.set_xlabel("optimizer update")
    by_hours.set_xlabel("modelled GPU-hours")
    report_page._updates_axis(by_update)
    for ax in (by_update, by_hours):
        ax.set_ylabel("mean reward")
        ax.grid(alpha=0.3)
    by_update.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return report_page._figure_png(fig)


def render_html(runs: list[RunRecord], found: Tables, peak_flops: float, mfu: float, assumption: str) -> str:
    differs = differing_fields(runs)
    fields = sorted({k for d in differs for k in d})
    what = [{"run": r.name, "preset": r.preset, **d} for r, d in zip(runs, differs)]
    heldout, paired, training = found.heldout, found.paired, found.training
    first = html.escape(runs[0].name)
    curves = curves_png(runs, peak_flops, mfu)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Comparison of runs</title>",
        f"<style>{report_page.STYLE}</style></head><body>",
        f"<h1>Comparison of {len(runs)} runs</h1>",
        "<h2>What differs</h2><p>The algorithm preset each run has every setting of (config/algorithms; - for "
        "none), and the contract fields whose value is not the same in every run.</p>",
        page_cells.table(what, ["run", "preset", *fields]),
        "<h2>Held-out change against the base model</h2><p>Each run's held-out check: the mean EvalKit score of the "
        "base and the trained model under the run's training sampler, and trained minus base on the same samples "
        "and noise with its 95 % paired bootstrap interval.</p>",
        page_cells.table(heldout, list(heldout[0])),
        "<h2>Paired difference between the runs</h2>",
        f"<p>Under each sampler every run's matrix evaluated its trained model with: each run minus {first}, "
        "sample by sample (same prompt, first frame and noise), with a 95 % bootstrap interval.</p>",
        page_cells.table(paired, ["sampler", "run", "against", "samples", "mean difference", "95 % interval"])
        if paired
        else "<p class='warn'>No sampler under which every run evaluated its trained model.</p>",
        "<h2>Reward per update and per modelled GPU-hour</h2>",
        f"<p>GPU-hours are modelled from the FLOPs each update's metrics record: {html.escape(assumption)}. Wall "
        "time per update is measured on the hardware each run trained on.</p>",
        f"<img alt='reward per update and per modelled GPU-hour' src='data:image/png;base64,{curves}'>",
        page_cells.table(training, list(training[0]), dict.fromkeys(SIGNIFICANT, page_cells.significant)),
        "</body></html>",
    ]
    return "\n".join(parts)
