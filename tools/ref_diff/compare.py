"""Differences between a project side file (A) and a reference side file (B): per rolled-out batch and per update,
the one-line summary of a run, and the schedule grid. Imports neither side's code (runs in either environment).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from tolerances import ADAMW, LATENT_FLIPS, TOLERANCE, limit, mode_tier, reached, within

NAN = float("nan")
FP32_LATENTS = TOLERANCE["fp32"]["latents"][0]
"""A latent element that differs by more than this differs by more than fp32 round-off: in bf16 mode, a flip."""


def maxdiff(x: torch.Tensor, y: torch.Tensor) -> float:
    return (x.float() - y.float()).abs().max().item() if x.numel() else 0.0


def rel(x: torch.Tensor, y: torch.Tensor) -> float:
    return maxdiff(x, y) / max(y.float().abs().max().item(), 1e-30) if x.numel() else 0.0


def cat(dct: dict, keys: list[str]) -> torch.Tensor:
    return torch.cat([dct[k].flatten() for k in keys]) if keys else torch.zeros(0)


def bf16_ulps(x: torch.Tensor, y: torch.Tensor) -> tuple[int, float]:
    """(elements that differ, largest difference in bf16 ulps of the larger magnitude)."""
    x, y = x.float(), y.float()
    diff = (x - y).abs()
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(x.abs(), y.abs()).clamp_min(1e-30))) - 7)
    return int((diff > 0).sum()), (diff / ulp).max().item()


def d(pair) -> float:
    a, b = pair
    return abs(a - b) if a is not None and b is not None else NAN


def stepped(moments: dict, before: dict) -> list[str]:
    """The transformers (snapshot prefixes) whose AdamW moments this update changed: the experts it trained."""
    changed = {k.split(".")[0] for k, v in moments.items() if k not in before or not torch.equal(v, before[k])}
    return sorted(changed)


def diffs(A: dict, B: dict) -> dict:
    """Per rolled-out batch and per update differences of two side files (A: the project, B: the reference)."""
    keys = sorted(A["before"])
    same_init = keys == sorted(B["before"]) and all(torch.equal(A["before"][k], B["before"][k]) for k in keys)
    out = dict(
        same_init=same_init, batches=[], updates=[], rolled_a=sorted(A["rollouts"]), rolled_b=sorted(B["rollouts"])
    )
    for bi in sorted(set(A["rollouts"]) & set(B["rollouts"])):
        ra, rb = A["rollouts"][bi], B["rollouts"][bi]
        n, ulps = bf16_ulps(ra["latents"], rb["latents"])
        out["batches"].append(
            dict(
                batch=bi,
                lat=maxdiff(ra["latents"], rb["latents"]),
                lat_rel=rel(ra["latents"], rb["latents"]),
                lat_n=n,
                lat_beyond=int(((ra["latents"].float() - rb["latents"].float()).abs() > FP32_LATENTS).sum()),
                lat_max=rb["latents"].float().abs().max().item() if rb["latents"].numel() else 0.0,
                lat_ulps=ulps,
                numel=ra["latents"].numel(),
                lp=maxdiff(ra["log_probs"], rb["log_probs"]),
                lp_rel=rel(ra["log_probs"], rb["log_probs"]),
                members=(ra.get("members"), rb.get("members")),
            )
        )
    prev_a, prev_b = A["before"], B["before"]
    moments_a, moments_b = {}, {}
    for ua, ub in zip(A["updates"], B["updates"]):
        ma, mb = ua["metrics"], ub["metrics"]
        pa, pb = cat(ua["params"], keys), cat(ub["params"], keys)
        da, db = pa - cat(prev_a, keys), pb - cat(prev_b, keys)
        mk = sorted(ua["exp_avg"])
        same_m = mk == sorted(ub["exp_avg"])
        same_lp = ua["new_log_probs"].shape == ub["new_log_probs"].shape
        rec = dict(
            update=ua["update"],
            replayed=(ua["replayed"], ub["replayed"]),
            rolled=(ua["rolled_out"], ub["rolled_out"]),
            stale=(ma.get("delayed_replay_staleness", 0.0), mb.get("delayed_replay_staleness", 0.0)),
            clip=(ma["ppo_clip_range"], mb["ppo_clip_range"]),
            lr=(ma["learning_rate"], mb["learning_rate"]),
            new_lp=maxdiff(ua["new_log_probs"], ub["new_log_probs"]) if same_lp else NAN,
            params=maxdiff(pa, pb),
            params_rel=rel(pa, pb),
            params_max=pb.abs().max().item() if pb.numel() else 0.0,
            upd=maxdiff(da, db),
            upd_rel=maxdiff(da, db) / db.abs().max().item() if db.abs().max() > 0 else NAN,
            cos=torch.nn.functional.cosine_similarity(da, db, dim=0).item() if da.norm() > 0 else NAN,
            m1=rel(cat(ua["exp_avg"], mk), cat(ub["exp_avg"], mk)) if same_m and mk else NAN,
            m2=rel(cat(ua["exp_avg_sq"], mk), cat(ub["exp_avg_sq"], mk)) if same_m and mk else NAN,
            m1_abs=maxdiff(cat(ua["exp_avg"], mk), cat(ub["exp_avg"], mk)) if same_m and mk else NAN,
            m2_abs=maxdiff(cat(ua["exp_avg_sq"], mk), cat(ub["exp_avg_sq"], mk)) if same_m and mk else NAN,
            m1_max=cat(ub["exp_avg"], mk).abs().max().item() if same_m and mk else NAN,
            m2_max=cat(ub["exp_avg_sq"], mk).abs().max().item() if same_m and mk else NAN,
            moments=(len(mk), len(ub["exp_avg"])),
            stepped=(stepped(ua["exp_avg"], moments_a), stepped(ub["exp_avg"], moments_b)),
        )
        for k in (
            "grad_norm",
            "policy_loss",
            "kl_loss",
            "advantage_mean",
            "ppo_ratio_mean",
            "ppo_ratio_abs_max",
            "ppo_clip_fraction",
        ):
            rec[k] = (ma.get(k), mb.get(k))
        out["updates"].append(rec)
        prev_a, prev_b = ua["params"], ub["params"]
        moments_a, moments_b = ua["exp_avg"], ub["exp_avg"]
    return out


def schedule_problems(A: dict, B: dict, D: dict) -> list[str]:
    """Every way the two runs' schedules differ (any difference fails): updates made, the update count of the lr
    schedule, the batches rolled out and their members, and per update the replayed batch, the rolled-out
    batches, staleness, clip range, the parameters with AdamW moments and the experts trained."""
    out = []
    if len(A["updates"]) != len(B["updates"]):
        out.append(f"updates {len(A['updates'])} / {len(B['updates'])}")
    if A["total"] != B["total"]:
        out.append(f"total (lr schedule) {A['total']} / {B['total']}")
    if D["rolled_a"] != D["rolled_b"]:
        out.append(f"rolled-out batches {D['rolled_a']} / {D['rolled_b']}")
    for r in D["batches"]:
        if r["members"][0] != r["members"][1]:
            out.append(f"batch {r['batch']}: members {r['members'][0]} / {r['members'][1]}")
    names = dict(replayed="replayed", rolled="rolled out", stale="staleness", clip="clip range")
    names.update(moments="parameters with moments", stepped="experts stepped")
    for r in D["updates"]:
        out += [f"update {r['update']}: {n} {r[k][0]} / {r[k][1]}" for k, n in names.items() if r[k][0] != r[k][1]]
    return out


def same_schedule(A: dict, B: dict, D: dict) -> bool:
    return not schedule_problems(A, B, D)


def mode_of(record: dict) -> str:
    """The precision mode a side file ran in: `videogrpo-traj-bf16` and `vbvr` are bf16 mode."""
    return "bf16" if record["side"] in ("videogrpo-traj-bf16", "vbvr") else "fp32"


def flipped(D: dict) -> set[int]:
    """The batches whose latents differ by more than fp32 round-off anywhere (in bf16 mode: flipped)."""
    return {r["batch"] for r in D["batches"] if r["lat_beyond"]}


def verdict(A: dict, B: dict, flipped_elsewhere: set[int] = frozenset()) -> dict:
    """Every compared quantity of a run against its tolerance (tolerances.py): mode, problems (schedule, settings,
    mode; each fails the run), rows of (quantity, where, |project - reference|, tolerance) and ok. In bf16 mode a
    quantity that no flip reaches is held to the fp32 bound; flipped_elsewhere adds the batches that flipped on
    the run's other ranks, which reach this rank's updates through the shared gradient."""
    D = diffs(A, B)
    mode = mode_of(A)
    problems = schedule_problems(A, B, D)
    if mode_of(B) != mode:
        problems.append(
            f"the project side ran in {mode} mode ({A['side']}), the reference in {mode_of(B)} ({B['side']})"
        )
    if A["set"] != B["set"]:
        problems.append("the two sides ran different settings")
    if not D["same_init"]:
        problems.append("the initial weights differ")
    U = D["updates"]
    hit, hit_batch = reached([(r["replayed"][1], r["rolled"][1]) for r in U], flipped(D) | set(flipped_elsewhere))
    rows = []

    def row(quantity, where, diff, tier, magnitude=0.0, extra=0.0, key=None):
        rows.append((quantity, where, diff, limit(tier, key or quantity, magnitude, extra)))

    x_t = [r["x_t_vs_inputs"] for r in A["rollouts"].values() if "x_t_vs_inputs" in r]
    if x_t:
        row("x_T", "the project's draws vs the inputs", max(x_t), "fp32", key="latents")
    for r in D["batches"]:
        where = f"batch {r['batch']}"
        row("latents", where, r["lat"], mode, r["lat_max"])
        fraction = r["lat_beyond"] / max(r["numel"], 1)
        rows.append(("latent elements beyond fp32 round-off", where, fraction, LATENT_FLIPS[mode]))
        row("log_probs", where, r["lp"], mode_tier(mode, hit_batch.get(r["batch"], r["batch"] in flipped(D))))
    lr_sum = 0.0
    for r, here in zip(U, hit):
        where, tier = f"update {r['update']}", mode_tier(mode, here)
        lr_sum += r["lr"][1]
        row("learning_rate", where, d(r["lr"]), "fp32", r["lr"][1])
        for k in ("grad_norm", "policy_loss", "kl_loss", "advantage_mean", "ppo_ratio_mean", "ppo_ratio_abs_max"):
            if r[k][1] is not None:  # the reference's standard path logs no PPO ratios or advantage mean
                key = "ppo" if k.startswith("ppo_ratio") else k
                row(k, where, d(r[k]), tier, r[k][1], key=key)
        if r["ppo_clip_fraction"][1] is not None:
            row("ppo_clip_fraction", where, d(r["ppo_clip_fraction"]), tier)
        row("new_log_probs", where, r["new_lp"], tier)
        row("params", where, r["params"], tier, r["params_max"], ADAMW * lr_sum)
        if r["moments"][0] == r["moments"][1] and r["moments"][0]:
            row("exp_avg", where, r["m1_abs"], tier, r["m1_max"])
            row("exp_avg_sq", where, r["m2_abs"], tier, r["m2_max"])
    ok = not problems and all(within(diff, tol) for _, _, diff, tol in rows)
    return dict(mode=mode, problems=problems, rows=rows, ok=ok, reached=sum(hit), updates=len(U))


def ratio(diff: float, tol: float) -> float:
    """A difference in units of its tolerance (inf for a NaN, or for any difference where none is allowed)."""
    if math.isnan(diff):
        return math.inf
    return diff / tol if tol > 0 else (0.0 if diff == 0 else math.inf)


def failures(v: dict) -> list[str]:
    """What broke its tolerance in a verdict, worst first, and the problems."""
    bad = sorted((r for r in v["rows"] if not within(r[2], r[3])), key=lambda r: -ratio(r[2], r[3]))
    return v["problems"] + [f"{q} ({w}): {diff:.2e} > {tol:.2e} ({ratio(diff, tol):.3g}x)" for q, w, diff, tol in bad]


def verdict_line(v: dict) -> str:
    """PASS or FAIL, the mode, and what broke its tolerance by how much (or how close the closest came)."""
    if not v["ok"]:
        bad = failures(v)
        more = f"; and {len(bad) - 4} more" if len(bad) > 4 else ""
        return f"FAIL ({v['mode']}): " + "; ".join(bad[:4]) + more
    q, w, diff, tol = closest(v)
    flips = f"; {v['reached']} of {v['updates']} updates reached by a bf16 flip" if v["mode"] == "bf16" else ""
    return f"PASS ({v['mode']}): closest {q} ({w}) {diff:.2e}, {ratio(diff, tol):.2f} of its tolerance {tol:.2e}{flips}"


def closest(v: dict) -> tuple:
    """The row of a verdict nearest its tolerance: how much room a passing run left."""
    return max(v["rows"], key=lambda r: ratio(r[2], r[3]), default=("nothing", "", 0.0, 1.0))


def rank_files(path: str) -> list[str]:
    """A side file's siblings of all ranks (rank 0 OUT, rank r OUT.rankR), rank 0 first."""
    base = path.rsplit(".rank", 1)[0] if ".rank" in Path(path).name else path
    others = Path(base).parent.glob(Path(base).name + ".rank*")
    others = sorted(others, key=lambda p: int(p.name.rsplit(".rank", 1)[1]))
    return [base] + [str(p) for p in others]


def run_verdict(a: str, b: str, A: dict | None = None, B: dict | None = None) -> dict:
    """The verdict of one rank's comparison, with the flips of the run's other ranks (their side files beside
    these) taken into account."""
    A = torch.load(a) if A is None else A
    B = torch.load(b) if B is None else B
    elsewhere = set()
    for ra, rb in zip(rank_files(a), rank_files(b)):
        if Path(ra) != Path(a) and Path(ra).exists() and Path(rb).exists():
            elsewhere |= flipped(diffs(torch.load(ra), torch.load(rb)))
    return verdict(A, B, elsewhere)


def largest(A: dict, B: dict) -> dict:
    """The largest difference of each compared quantity over all batches and updates of one comparison."""
    D = diffs(A, B)
    U, Bt = D["updates"], D["batches"]

    def mx(rows, k):
        return max((x[k] for x in rows), default=NAN)

    def mxd(k):
        return max((d(x[k]) for x in U), default=NAN)

    return dict(
        updates=len(U),
        schedule=same_schedule(A, B, D),
        same_init=D["same_init"],
        lr=max((abs(x["lr"][0] - x["lr"][1]) for x in U), default=NAN),
        latents=mx(Bt, "lat"),
        latents_n=sum(x["lat_n"] for x in Bt),
        latents_numel=sum(x["numel"] for x in Bt),
        old_lp=mx(Bt, "lp"),
        new_lp=mx(U, "new_lp"),
        grad_norm=mxd("grad_norm"),
        policy_loss=mxd("policy_loss"),
        kl_loss=mxd("kl_loss"),
        params=mx(U, "params"),
        params_rel=mx(U, "params_rel"),
        exp_avg=mx(U, "m1"),
        exp_avg_sq=mx(U, "m2"),
    )


def print_compare(A: dict, B: dict) -> None:
    s = A["set"]
    if A["set"] != B["set"]:
        print("WARNING: the two sides ran different settings")
    D = diffs(A, B)
    eta = f"eta range {s['eta_range']}" if s.get("eta_range") else f"eta {s['eta']}"
    print(
        f"{A['side']} vs {B['side']}: {s.get('kind', 'ti2v')} sampler {s['sampler']} {eta} T {s['T']} G {s['G']} "
        f"{'delayed replay' if s['delayed'] else 'synchronous'} world {s['world']}{' fsdp' if s.get('fsdp') else ''} "
        f"lr {s['lr']:g} warmup {s['warmup']} max_grad_norm {s['max_grad_norm']} perturb {s['perturb']} | updates "
        f"{len(A['updates'])} / {len(B['updates'])}, total (LR schedule) {A['total']} / {B['total']}"
    )
    print("initial weights identical:", D["same_init"])
    x_t = [r["x_t_vs_inputs"] for r in A["rollouts"].values() if "x_t_vs_inputs" in r]
    if x_t:
        print(f"the project's own x_T draws vs the ones the reference was handed: max|diff| {max(x_t):.1e}")
    print("rolled-out batches: {} / {}".format(D["rolled_a"], D["rolled_b"]))
    print(" batch  latents max|diff|   rel     differing elements (max bf16 ulps)   old log-p max|diff|   rel")
    for r in D["batches"]:
        print(
            f" {r['batch']:5d}  {r['lat']:.3e}  {r['lat_rel']:.3e}  {r['lat_n']:6d} of {r['numel']} "
            f"({r['lat_ulps']:.2f})          {r['lp']:.3e}  {r['lp_rel']:.3e}"
        )
    print(
        " upd  replayed rolled-out  stale  clip         lr A        lr B        grad_norm A   |dgn|     "
        "policy_loss A  |dpl|      kl_loss A     |dkl|      new log-p |d|"
    )
    for r in D["updates"]:
        rep = "{}/{}".format(*r["replayed"])
        rol = ("{}/{}".format(*r["rolled"])).replace(" ", "")
        print(
            f" {r['update']:3d}  {rep:8s} {rol:11s} {r['stale'][0]:g}/{r['stale'][1]:g}    "
            f"{r['clip'][0]:.0e}/{r['clip'][1]:.0e}  {r['lr'][0]:.4e}  {r['lr'][1]:.4e}  "
            f"{r['grad_norm'][0]:.6e}  {d(r['grad_norm']):.2e}  {r['policy_loss'][0]:+.6e}  "
            f"{d(r['policy_loss']):.2e}  {r['kl_loss'][0]:.6e}  {d(r['kl_loss']):.2e}  {r['new_lp']:.2e}"
        )
    print(
        " upd  params max|dA-dB|  rel     update max|dA-dB|  rel    cos(update)   exp_avg rel   exp_avg_sq rel  "
        "moments  experts stepped A / B"
    )
    for r in D["updates"]:
        print(
            f" {r['update']:3d}  {r['params']:.3e}  {r['params_rel']:.2e}   {r['upd']:.3e}  {r['upd_rel']:.2e}   "
            f"{r['cos']:.7f}     {r['m1']:.2e}      {r['m2']:.2e}       {r['moments'][0]}/{r['moments'][1]}   "
            f"{','.join(r['stepped'][0])} / {','.join(r['stepped'][1])}"
        )
    print(" upd  ppo_ratio_mean A   |d|       ratio_abs_max A  |d|       clip_fraction A/B   advantage_mean |d|")
    for r in D["updates"]:
        if r["ppo_ratio_mean"][1] is None:  # the reference's standard (non-shared-prompt) path logs none
            print(f" {r['update']:3d}  {r['ppo_ratio_mean'][0]:.9f}   (the reference's standard path logs none)")
            continue
        print(
            f" {r['update']:3d}  {r['ppo_ratio_mean'][0]:.9f}  {d(r['ppo_ratio_mean']):.2e}  "
            f"{r['ppo_ratio_abs_max'][0]:.6e}   {d(r['ppo_ratio_abs_max']):.2e}  "
            f"{r['ppo_clip_fraction'][0]:.4f}/{r['ppo_clip_fraction'][1]:.4f}     {d(r['advantage_mean']):.2e}"
        )
    print("timing (s): total {:.2f} / {:.2f}".format(A["t_total"], B["t_total"]))


def fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return "0" if x == 0 else f"{x:.1e}"


COLUMNS = ("latents", "old log-p", "new log-p", "grad norm", "policy loss", "KL", "params (rel)", "exp_avg rel")


def summary_rows(pairs: list[tuple[str, str, str]]) -> tuple[list[str], list[tuple[str, dict]]]:
    """Markdown rows (label, mode, the largest differences, the verdict) for each (label, project file, reference
    file), and each label's verdict. A passing row shows the fraction of its tolerance the closest quantity used."""
    rows = [
        "| run (updates) | mode | schedule | " + " | ".join(COLUMNS) + " | verdict |",
        "|---|---|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    verdicts = []
    for label, a, b in pairs:
        A, B = torch.load(a), torch.load(b)
        x = largest(A, B)
        v = run_verdict(a, b, A, B)
        verdicts.append((label, v))
        name, _, mode = label.rpartition(" ")
        lat = fmt(x["latents"])
        if x["latents_n"] and x["latents"] > 1e-5:
            lat += f" ({x['latents_n']} of {x['latents_numel']})"
        sched = ("same" if x["schedule"] else "DIFFERS") + ("" if x["same_init"] else ", init DIFFERS")
        cells = [
            lat,
            fmt(x["old_lp"]),
            fmt(x["new_lp"]),
            fmt(x["grad_norm"]),
            fmt(x["policy_loss"]),
            fmt(x["kl_loss"]),
            f"{fmt(x['params'])} ({fmt(x['params_rel'])})",
            fmt(x["exp_avg"]),
            f"PASS ({ratio(*closest(v)[2:]):.2f} of {closest(v)[0]})" if v["ok"] else "FAIL: " + failures(v)[0],
        ]
        rows.append(f"| {name} ({x['updates']}) | {mode} | {sched} | " + " | ".join(cells) + " |")
    return rows, verdicts


def final_line(verdicts: list[tuple[str, dict]]) -> str:
    """The summary's last line: per mode, how many comparisons passed, and the ones that failed."""
    parts = []
    for mode in sorted({v["mode"] for _, v in verdicts}):
        runs = [(label, v) for label, v in verdicts if v["mode"] == mode]
        bad = [label for label, v in runs if not v["ok"]]
        parts.append(
            f"{mode} {len(runs) - len(bad)} of {len(runs)} pass" + (f" (FAIL: {', '.join(bad)})" if bad else "")
        )
    ok = all(v["ok"] for _, v in verdicts)
    return ("PASS: " if ok else "FAIL: ") + "; ".join(parts)


GRID = [
    dict(batches=b, epochs=e, save_steps=sv, max_steps=m, delayed=dl, warmup=2)
    for dl in (True, False)
    for b in (1, 2, 3, 5)
    for e in (1, 2)
    for sv in (0, 2, 3)
    for m in (None, 1, 2, 4)
]
"""The schedule grid: synchronous and delayed; 1-5 batches per epoch; 1-2 epochs; save_steps 0/2/3; max_steps
none/1/2/4 (192 configurations)."""


def plan_compare(a: str, b: str, lr: float) -> int:
    """Print the grid points whose schedules differ; returns their number."""
    A, B = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    bad = 0
    if len(A) != len(B):
        bad += 1
        print(f"the two sides ran {len(A)} / {len(B)} schedules")
    for ra, rb in zip(A, B):
        assert ra["point"] == rb["point"]
        problems = []
        if ra["total"] != rb["total"]:
            problems.append(f"total updates {ra['total']} / {rb['total']}")
        if len(ra["updates"]) != len(rb["updates"]):
            problems.append(f"updates made {len(ra['updates'])} / {len(rb['updates'])}")
        for ua, ub in zip(ra["updates"], rb["updates"]):
            for k in ("replayed", "rolled_out", "staleness", "flush", "clip"):
                if ua[k] != ub[k]:
                    problems.append(f"update {ua['update']}: {k} {ua[k]} / {ub[k]}")
            if abs(ua["lr"] - ub["lr"]) > 1e-12 * lr:
                problems.append(f"update {ua['update']}: lr {ua['lr']:.6e} / {ub['lr']:.6e}")
        if problems:
            bad += 1
            print(ra["point"], "; ".join(problems[:6]))
    n = sum(len(r["updates"]) for r in A)
    print(
        f"plan: {len(A)} schedules ({n} updates; synchronous and delayed, 1-5 batches/epoch, 1-2 epochs, "
        f"save_steps 0/2/3, max_steps none/1/2/4): {len(A) - bad} identical "
        f"(replayed batch, rolled-out batches, staleness, flush, clip range, lr), {bad} differ"
    )
    return bad
