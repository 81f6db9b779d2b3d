"""Stored comparisons: small inputs together with the reference trainer's results on them, so that the project
side can be compared with the reference without the reference (tests/test_ref_diff.py, `ref_diff.py check`).

A stored file holds the settings, prompt embeddings, conditions, rewards, replayed timesteps and etas of an
inputs file (not its noise: the project draws that itself, counter-keyed, and the comparison's latents show
whether it still draws what the reference was handed), and the reference's results in `compact` form: every
rolled-out log-probability, replayed log-probability and update metric whole; latents, parameters and AdamW
moments as a fixed, evenly spaced sample of their elements. Imports neither side's code.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

# The full comparison's tolerances (one table for both). A sample's largest difference is at most the whole
# tensor's, and so is its largest magnitude, which scales the relative bounds: on a sample they are as strict.
from tolerances import ADAMW, LATENT_FLIPS, TOLERANCE, limit, mode_tier, reached, within

SAMPLE = 1024
"""Elements kept of each sampled tensor (evenly spaced over its flattened elements)."""

METRICS = (
    "grad_norm",
    "policy_loss",
    "kl_loss",
    "learning_rate",
    "advantage_mean",
    "ppo_clip_range",
    "delayed_replay_staleness",
    "ppo_ratio_mean",
    "ppo_ratio_abs_max",
    "ppo_clip_fraction",
)


def sample(t: torch.Tensor, n: int = SAMPLE) -> torch.Tensor:
    flat = t.detach().float().flatten()
    if flat.numel() <= n:
        return flat.clone()
    return flat[torch.linspace(0, flat.numel() - 1, n).round().long()].clone()


def _cat(dct: dict) -> torch.Tensor:
    return torch.cat([dct[k].flatten() for k in sorted(dct)]) if dct else torch.zeros(0)


def compact(record: dict) -> dict:
    """A side file reduced to what a stored comparison keeps."""
    from compare import stepped

    before = [{}] + [u["exp_avg"] for u in record["updates"]]
    return dict(
        side=record["side"],
        total=record["total"],
        before=sample(_cat(record["before"])),
        parameters=len(record["before"]),
        rollouts={
            b: dict(latents=sample(r["latents"], 2 * SAMPLE), log_probs=r["log_probs"].float(), members=r["members"])
            for b, r in record["rollouts"].items()
        },
        updates=[
            dict(
                update=u["update"],
                replayed=u["replayed"],
                rolled_out=list(u["rolled_out"]),
                metrics={k: u["metrics"][k] for k in METRICS if u["metrics"].get(k) is not None},
                new_log_probs=u["new_log_probs"].float(),
                params=sample(_cat(u["params"])),
                params_max=_cat(u["params"]).abs().max().item(),
                exp_avg=sample(_cat(u["exp_avg"])),
                exp_avg_sq=sample(_cat(u["exp_avg_sq"])),
                moments=sorted({k.split(".")[0] for k in u["exp_avg"]}),
                stepped=stepped(u["exp_avg"], previous),
            )
            for u, previous in zip(record["updates"], before)
        ],
    )


def stored_inputs(d: dict) -> dict:
    """An inputs file without its noise (the project side draws its own)."""
    return {k: d[k] for k in ("set", "embeds", "cond", "rewards", "timesteps", "etas", "shape")}


def _within(
    name: str, a, b, tier: str, scale: float | None = None, extra: float = 0.0
) -> tuple[str, float, float, bool]:
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    key = name.split(" ")[0]
    key = "ppo" if key in ("ppo_ratio_mean", "ppo_ratio_abs_max") else key
    magnitude = scale if scale is not None else (b.abs().max().item() if b.numel() else 0.0)
    tol = limit(tier, key, magnitude, extra)
    return name, diff, tol, within(diff, tol)


def check(project: dict, reference: dict, mode: str) -> tuple[list[str], list[tuple[str, float, float, bool]]]:
    """Compare a compact project record with a stored compact reference record: (problems, rows of (quantity,
    largest |difference|, tolerance, within))."""
    problems, rows = [], []
    if project["parameters"] != reference["parameters"] or not torch.equal(project["before"], reference["before"]):
        problems.append(
            "the initial weights differ from those the reference was run with (the tiny model or the perturbation "
            "changed): regenerate the stored comparisons (tools/ref_diff/README.md)"
        )
    if project["total"] != reference["total"]:
        problems.append(f"total updates {project['total']} / {reference['total']}")
    if sorted(project["rollouts"]) != sorted(reference["rollouts"]):
        problems.append(f"rolled-out batches {sorted(project['rollouts'])} / {sorted(reference['rollouts'])}")
    if len(project["updates"]) != len(reference["updates"]):
        problems.append(f"updates {len(project['updates'])} / {len(reference['updates'])}")
    # In bf16 mode what a flip reaches is held to the bf16 bounds, the rest to fp32's (tolerances.py); the flips
    # are those of the sampled elements, which is what the stored comparison holds.
    batches = sorted(set(project["rollouts"]) & set(reference["rollouts"]))
    fp32_latents = TOLERANCE["fp32"]["latents"][0]
    beyond = {
        b: (project["rollouts"][b]["latents"] - reference["rollouts"][b]["latents"]).abs() > fp32_latents
        for b in batches
    }
    hit, hit_batch = reached(
        [(u["replayed"], u["rolled_out"]) for u in reference["updates"]], {b for b in batches if beyond[b].any()}
    )
    for b in batches:
        ra, rb = project["rollouts"][b], reference["rollouts"][b]
        if ra["members"] != rb["members"]:
            problems.append(f"batch {b}: members {ra['members']} / {rb['members']}")
        rows.append(_within(f"latents (batch {b})", ra["latents"], rb["latents"], mode))
        flips = beyond[b].float().mean().item()
        if flips > LATENT_FLIPS[mode]:
            problems.append(f"batch {b}: {flips:.2%} of the sampled latent elements differ beyond round-off")
        tier = mode_tier(mode, hit_batch.get(b, bool(beyond[b].any())))
        rows.append(_within(f"log_probs (batch {b})", ra["log_probs"], rb["log_probs"], tier))
    lr_sum = 0.0
    for ua, ub, here in zip(project["updates"], reference["updates"], hit):
        u, tier = ua["update"], mode_tier(mode, here)
        lr_sum += ub["metrics"]["learning_rate"]
        for k in ("replayed", "rolled_out", "moments", "stepped"):
            if ua[k] != ub[k]:
                problems.append(f"update {u}: {k} {ua[k]} / {ub[k]}")
        for k in ("ppo_clip_range", "delayed_replay_staleness"):
            if ua["metrics"].get(k) != ub["metrics"].get(k):
                problems.append(f"update {u}: {k} {ua['metrics'].get(k)} / {ub['metrics'].get(k)}")
        for k, vb in ub["metrics"].items():
            if k in ("ppo_clip_range", "delayed_replay_staleness"):
                continue
            rows.append(
                _within(
                    f"{k} (update {u})", ua["metrics"].get(k, math.nan), vb, "fp32" if k == "learning_rate" else tier
                )
            )
        if ua["new_log_probs"].shape != ub["new_log_probs"].shape:
            problems.append(
                f"update {u}: replayed log-probs {tuple(ua['new_log_probs'].shape)} / "
                f"{tuple(ub['new_log_probs'].shape)}"
            )
        else:
            rows.append(_within(f"new_log_probs (update {u})", ua["new_log_probs"], ub["new_log_probs"], tier))
        rows.append(_within(f"params (update {u})", ua["params"], ub["params"], tier, ub["params_max"], ADAMW * lr_sum))
        for k in ("exp_avg", "exp_avg_sq"):
            if ua[k].shape == ub[k].shape:
                rows.append(_within(f"{k} (update {u})", ua[k], ub[k], tier))
            else:
                problems.append(f"update {u}: {k} of {ua[k].numel()} / {ub[k].numel()} sampled elements")
    problems += [f"{name}: |project - reference| {diff:.3e} > {tol:.3e}" for name, diff, tol, ok in rows if not ok]
    return problems, rows


def run_stored(path: str | Path, model: Path, work: Path) -> tuple[dict, list[str], list[tuple]]:
    """Run the project side on a stored comparison's inputs and check it against the stored reference results:
    (the stored file, problems, rows)."""
    import project_adapter

    stored = torch.load(path)
    record = project_adapter.run_trainer(stored["inputs"], model, work, stored["traj"])
    problems, rows = check(compact(record), stored["reference"], stored["mode"])
    return stored, problems, rows
