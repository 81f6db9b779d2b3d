"""The ref_diff command line: each step of a comparison between this project's GRPO trainer and the reference's.

  P=<the project's python>  V=$DIFF_WORK/.venv/bin/python (the reference's)  R=tools/ref_diff/ref_diff.py
  $P $R models                                   # the tiny TI2V and two-expert I2V models in $DIFF_WORK
  $P $R inputs    W/in.pt [--KEY=VALUE ...]      # shared inputs; KEY any setting of common.DEFAULTS, e.g.
                  --kind=i2v_a14b --sampler=flowcps --eta=0.7 --eta_range=0.5,0.9 --updates=6 --warmup=2
                  --fraction=0.7 --perturb=0.05 --max_grad_norm=0.14 --lr=1e-2 --delayed --batches=4 --epochs=2
                  [--max_steps=N] --world=2 [--fsdp=1]
  $P $R videogrpo W/in.pt W/a.pt [--traj-bf16]   # the project's trainer (grpo.trajectory_dtype bfloat16)
  $V $R reference W/in.pt W/b.pt [--fp32]        # the reference's trainer (--fp32: its bf16 casts to float32)
  $V $R compare   W/a.pt W/b.pt                  # per rolled-out batch and per update, then PASS or FAIL
  $V $R summary   "LABEL MODE=W/a.pt:W/b.pt" ... # a markdown row per comparison: largest differences, verdict
  $P $R plan-videogrpo W/pa.json; $V $R plan-reference W/pb.json; $V $R plan-compare W/pa.json W/pb.json
  $P $R split-videogrpo W/sa.json; $V $R split-reference W/sb.json; $V $R split-compare W/sa.json W/sb.json
                                                 # the asynchronous rollout actors' schedule (split_schedule.py)
  $V $R split-store OUT.json W/sb.json COMMIT    # its reference side, compact (tests/data/ref_diff)
  $V $R probe                                    # the reference's own model, sampler and loss functions
  $V $R store OUT.pt W/in.pt W/a.pt W/b.pt MODE   # a stored comparison (tests/data/ref_diff), checked as it is made
  $P $R check tests/data/ref_diff/*.pt           # the project side against the stored comparisons
With --world=2 run both sides under `python -m torch.distributed.run --standalone --nproc-per-node=2` (gloo);
rank r > 0 writes OUT.rankR. run_all.sh runs every comparison; README.md says what each one covers.
`compare`, `summary`, `plan-compare`, `split-compare`, `store` and `check` exit 1 when a comparison breaks a
tolerance of tolerances.py (or its schedule differs), 0 when all pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULTS, FLOATS, WORK  # noqa: E402

LR, CLIP, DELAYED_CLIP = DEFAULTS["lr"], DEFAULTS["clip_range"], DEFAULTS["delayed_clip_range"]


def settings(flags: list[str]) -> dict:
    """--key=value flags over DEFAULTS (the `inputs` step only: the sides read the settings from its file)."""
    s = dict(DEFAULTS)
    for x in flags:
        k, _, v = x[2:].partition("=")
        if k not in s:
            raise SystemExit(f"{x}: unknown setting; known: {', '.join(s)}")
        if k == "delayed":
            s[k] = v in ("", "1", "true")
        elif k in ("sampler", "kind"):
            s[k] = v
        elif k == "eta_range":
            s[k] = [float(y) for y in v.split(",")] if v else None
        elif k in FLOATS:
            s[k] = float(v)
        else:
            s[k] = int(v)
    if s["eta"] is None:
        s["eta"] = 0.7 if s["sampler"] == "flowcps" else 0.3
    return s


def option(argv: list[str], name: str) -> str | None:
    for x in argv:
        if x.startswith(f"--{name}="):
            return x.partition("=")[2]
    return None


def main(argv: list[str]) -> None:
    cmd, rest = argv[0], argv[1:]
    args = [x for x in rest if not x.startswith("--")]
    flags = [x for x in rest if x.startswith("--")]
    if cmd == "models":
        import project_adapter

        project_adapter.build_tiny_models(WORK)
    elif cmd == "inputs":
        import project_adapter
        import torch
        from common import model_dir

        s = settings(flags)
        d = project_adapter.make_inputs(s, Path(option(flags, "model") or model_dir(s)))
        torch.save(d, args[0])
        print(
            "inputs:",
            args[0],
            "shape",
            d["shape"],
            "batches",
            len(d["init"]),
            "timesteps",
            d["timesteps"],
            "etas" if d["etas"] else "",
            [round(e, 4) for e in d["etas"] or []] or "",
            json.dumps(s),
        )
    elif cmd == "videogrpo":
        import project_adapter

        traj = "bfloat16" if "--traj-bf16" in flags else "float32"
        project_adapter.run_side(args[0], args[1], traj, option(flags, "model"))
    elif cmd == "reference":
        import reference_side

        reference_side.run_reference(args[0], args[1], "--fp32" in flags, option(flags, "model"))
    elif cmd == "compare":
        import compare
        import torch

        A, B = torch.load(args[0]), torch.load(args[1])
        compare.print_compare(A, B)
        v = compare.run_verdict(args[0], args[1], A, B)
        print(compare.verdict_line(v))
        if not v["ok"]:
            raise SystemExit(1)
    elif cmd == "summary":
        import compare

        pairs = []
        for item in args:
            label, _, files = item.partition("=")
            a, _, b = files.partition(":")
            pairs.append((label, a, b))
        rows, verdicts = compare.summary_rows(pairs)
        print("\n".join(rows))
        print(compare.final_line(verdicts))
        if not all(v["ok"] for _, v in verdicts):
            raise SystemExit(1)
    elif cmd == "plan-videogrpo":
        import compare
        import project_adapter

        runs = project_adapter.schedules(compare.GRID, LR, CLIP, DELAYED_CLIP)
        Path(args[0]).write_text(json.dumps(runs))
        print(f"plan-videogrpo: {len(runs)} schedules")
    elif cmd == "plan-reference":
        import compare
        import reference_side

        runs = reference_side.reference_schedules(compare.GRID, LR, CLIP, DELAYED_CLIP)
        Path(args[0]).write_text(json.dumps(runs))
        print(f"plan-reference: {len(runs)} schedules")
    elif cmd == "plan-compare":
        import compare

        if compare.plan_compare(args[0], args[1], LR):
            raise SystemExit(1)
    elif cmd in ("split-videogrpo", "split-reference"):
        import split_schedule

        grid = split_schedule.GRID
        if cmd == "split-videogrpo":
            import project_adapter

            runs = project_adapter.split_schedules(grid)
        else:
            runs = split_schedule.reference(grid, WORK / "run_split")
        Path(args[0]).write_text(json.dumps(runs))
        print(f"{cmd}: {len(runs)} schedules")
    elif cmd == "split-compare":
        import split_schedule

        if split_schedule.compare(args[0], args[1]):
            raise SystemExit(1)
    elif cmd == "split-store":
        import split_schedule

        split_schedule.store(args[1], args[0], args[2])
    elif cmd == "store":
        import stored
        import torch

        out, inp, project, reference, mode = args
        d, A, B = torch.load(inp), torch.load(project), torch.load(reference)
        torch.save(
            dict(
                note=(
                    "A stored comparison of tools/ref_diff (README.md there): the inputs (no noise: the project "
                    "draws its own) and the reference trainer's results on them, compacted by stored.compact."
                ),
                produced_by=dict(
                    command="tools/ref_diff/run_all.sh (its `stored` cases)",
                    project_commit=option(flags, "project-commit"),
                    reference_commit=option(flags, "reference-commit"),
                    reference_side=B["side"],
                    torch=str(torch.__version__),
                ),
                mode=mode,
                traj="bfloat16" if mode == "bf16" else "float32",
                inputs=stored.stored_inputs(d),
                reference=stored.compact(B),
            ),
            out,
        )
        problems, _ = stored.check(stored.compact(A), stored.compact(B), mode)
        print(f"store: {out} ({Path(out).stat().st_size // 1024} KB)", "; ".join(problems) or "project side within")
        if problems:
            raise SystemExit(1)
    elif cmd == "check":
        import stored
        from common import model_dir

        failed = 0
        for path in args:
            s = __import__("torch").load(path)["inputs"]["set"]
            _, problems, rows = stored.run_stored(path, Path(option(flags, "model") or model_dir(s)), WORK / "check")
            for name, diff, tol, ok in rows:
                print(f"{name:32s} {diff:.3e}  (tolerance {tol:.3e}){'' if ok else '  EXCEEDED'}")
            print(f"{path}: " + ("FAIL: " + "; ".join(problems) if problems else "PASS: within the tolerances"))
            failed += bool(problems)
        if failed:
            raise SystemExit(1)
    elif cmd == "probe":
        import probe

        probe.main()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:] or ["help"])
