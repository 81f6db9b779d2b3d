"""tools/ref_diff's verdicts: every compared quantity against its tolerance (tools/ref_diff/tolerances.py), the exit
status of `compare`, `summary` and `plan-compare`, and run_all.sh's handling of failures and of a reference given
as a plain tree. No reference, no model and no network: the side files here are built in place, and run_all.sh
runs with a stand-in python that records what it was asked.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

TOOL = REPO / "tools/ref_diff"
sys.path.insert(0, str(TOOL))

import compare  # noqa: E402
import ref_diff  # noqa: E402
import stored  # noqa: E402
from common import DEFAULTS  # noqa: E402
from tolerances import ADAMW, TOLERANCE  # noqa: E402

SIDES = {"fp32": ("videogrpo", "vbvr-fp32"), "bf16": ("videogrpo-traj-bf16", "vbvr")}
BATCH = 4096  # latent elements of a rolled-out batch


def reference(mode: str) -> dict:
    """A reference side file of 3 synchronous updates (update k rolls out and replays batch k - 1)."""
    g = torch.Generator().manual_seed(0)
    names = ["transformer.a", "transformer.b"]
    params = {n: torch.randn(64, generator=g) for n in names}
    rollouts, updates = {}, []
    for b in range(3):
        latents = 2 * torch.randn(4, 1024, generator=g)
        if mode == "bf16":
            latents = latents.bfloat16().float()
        rollouts[b] = dict(latents=latents, log_probs=torch.randn(4, 4, generator=g) - 1, members=[0, 1, 2, 3])
    for k in range(3):
        params = {n: p - 1e-4 * torch.randn(64, generator=g).sign() for n, p in params.items()}
        metrics = dict(learning_rate=1e-4, grad_norm=0.1 + 0.01 * k, policy_loss=1e-3, kl_loss=0.02)
        metrics.update(advantage_mean=1e-8, ppo_clip_range=1e-3, delayed_replay_staleness=0.0)
        metrics.update(ppo_ratio_mean=1.0, ppo_ratio_abs_max=1e-4, ppo_clip_fraction=0.0)
        updates.append(
            dict(
                update=k + 1,
                replayed=k,
                rolled_out=[k],
                metrics=metrics,
                new_log_probs=rollouts[k]["log_probs"][:, :2].clone(),
                params=params,
                exp_avg={n: 1e-3 * torch.randn(64, generator=g) for n in names},
                exp_avg_sq={n: 1e-6 * torch.rand(64, generator=g) for n in names},
            )
        )
    s = dict(DEFAULTS, eta=0.3, updates=3)
    before = {n: p + 3e-4 for n, p in updates[0]["params"].items()}
    return dict(set=s, side=SIDES[mode][1], total=3, before=before, rollouts=rollouts, updates=updates, t_total=0.0)


def project(B: dict) -> dict:
    """The project's side file equal to the reference's B."""
    A = copy.deepcopy(B)
    A["side"] = SIDES["fp32" if B["side"] == "vbvr-fp32" else "bf16"][0]
    for r in A["rollouts"].values():
        r["x_t_vs_inputs"] = 0.0
    return A


def flip(latents: torch.Tensor, n: int) -> torch.Tensor:
    """latents (bf16 values) with n evenly spaced elements moved one bf16 ulp: what a rounding flip does."""
    flat = latents.flatten().bfloat16()
    at = torch.linspace(0, flat.numel() - 1, n).long()
    bits = flat.view(torch.int16).clone()
    bits[at] += 1
    return bits.view(torch.bfloat16).float().view_as(latents)


def tolerance_of(v: dict, quantity: str, where: str) -> float:
    [tol] = [t for q, w, _, t in v["rows"] if q == quantity and w == where]
    return tol


def test_equal_runs_pass_in_both_modes():
    for mode in ("fp32", "bf16"):
        B = reference(mode)
        v = compare.verdict(project(B), B)
        assert v["ok"] and v["mode"] == mode, compare.failures(v)
        assert compare.verdict_line(v).startswith(f"PASS ({mode})")


# (quantity as the verdict names it, where, how to push the project side by `delta`)
PUSHES = {
    "latents": ("batch 1", lambda A, x: A["rollouts"][1]["latents"].view(-1)[7].add_(x)),
    "log_probs": ("batch 2", lambda A, x: A["rollouts"][2]["log_probs"].view(-1)[3].add_(x)),
    "new_log_probs": ("update 2", lambda A, x: A["updates"][1]["new_log_probs"].view(-1)[1].add_(x)),
    "params": ("update 3", lambda A, x: A["updates"][2]["params"]["transformer.b"][5].add_(x)),
    "exp_avg": ("update 2", lambda A, x: A["updates"][1]["exp_avg"]["transformer.a"][9].add_(x)),
    "exp_avg_sq": ("update 1", lambda A, x: A["updates"][0]["exp_avg_sq"]["transformer.a"][9].add_(x)),
    **{
        k: ("update 2", lambda A, x, k=k: A["updates"][1]["metrics"].__setitem__(k, A["updates"][1]["metrics"][k] + x))
        for k in ("grad_norm", "policy_loss", "kl_loss", "learning_rate", "advantage_mean", "ppo_ratio_mean")
    },
}


@pytest.mark.parametrize("quantity", sorted(PUSHES))
def test_a_quantity_past_its_tolerance_fails_and_is_named(quantity):
    B = reference("fp32")
    where, push = PUSHES[quantity]
    tol = tolerance_of(compare.verdict(project(B), B), quantity, where)
    assert tol > 0 or quantity == "learning_rate"
    inside, outside = project(B), project(B)
    push(inside, 0.5 * tol)
    push(outside, 1.5 * tol if tol else 1e-9)
    assert compare.verdict(inside, B)["ok"], compare.failures(compare.verdict(inside, B))
    v = compare.verdict(outside, B)
    assert not v["ok"]
    line = compare.verdict_line(v)
    assert line.startswith("FAIL (fp32): ") and (quantity in line or "latent" in line), line
    assert f"{quantity} ({where})" in " ".join(compare.failures(v)) + line or quantity == "latents"


def test_the_tolerances_are_the_tables():
    """The bound of a relative quantity is the table's fraction of the reference's value, nothing looser."""
    B = reference("fp32")
    v = compare.verdict(project(B), B)
    assert tolerance_of(v, "grad_norm", "update 2") == pytest.approx(TOLERANCE["fp32"]["grad_norm"][1] * 0.11)
    assert tolerance_of(v, "log_probs", "batch 0") == TOLERANCE["fp32"]["log_probs"][0]
    largest = torch.cat([m.abs() for m in B["updates"][1]["exp_avg"].values()]).max().item()
    assert tolerance_of(v, "exp_avg", "update 2") == pytest.approx(TOLERANCE["fp32"]["exp_avg"][1] * largest)
    largest = torch.cat([q.abs() for q in B["updates"][2]["params"].values()]).max().item()
    expected = TOLERANCE["fp32"]["params"][1] * largest + ADAMW * 3e-4  # three updates at lr 1e-4
    assert tolerance_of(v, "params", "update 3") == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_a_changed_advantage_epsilon_fails(mode):
    """A std epsilon of 2e-4 instead of 1e-4 scales the group advantages, and so the grad norm, by about 2.8e-4
    (rewards of std 0.36): in fp32 mode, and in bf16 mode before any flip, that fails."""
    B = reference(mode)
    A = project(B)
    A["updates"][0]["metrics"]["grad_norm"] *= 1 + 2.8e-4
    v = compare.verdict(A, B)
    assert not v["ok"] and compare.failures(v)[0].startswith("grad_norm (update 1)"), compare.failures(v)


def bf16_with_flips(n: int) -> tuple[dict, dict]:
    """A bf16 run whose batch 1 (replayed at update 2) has n one-ulp flips, with what the flips do downstream: the
    batch's log-probabilities and update 2's and 3's grad norm and moments move by bf16 amounts."""
    B = reference("bf16")
    A = project(B)
    A["rollouts"][1]["latents"] = flip(B["rollouts"][1]["latents"], n)
    A["rollouts"][1]["log_probs"].view(-1)[0] += 5e-5
    for u in A["updates"][1:]:
        u["metrics"]["grad_norm"] *= 1 + 2e-4
        u["new_log_probs"].view(-1)[0] += 5e-5
        u["exp_avg"]["transformer.a"][0] += 2e-3 * 3e-3
    return A, B


def test_a_few_bf16_flips_pass_and_reach_what_follows():
    A, B = bf16_with_flips(5)  # 5 of 4096 elements, as a bf16 run flips a handful per batch
    v = compare.verdict(A, B)
    assert v["ok"], compare.failures(v)
    assert v["reached"] == 2 and "2 of 3 updates reached by a bf16 flip" in compare.verdict_line(v)


def test_many_bf16_flips_fail():
    A, B = bf16_with_flips(200)  # 5% of the batch: a difference of code, not of rounding
    v = compare.verdict(A, B)
    assert not v["ok"]
    assert compare.failures(v)[0].startswith("latent elements beyond fp32 round-off (batch 1): 4.88e-02 > 1.00e-02")


def test_bf16_before_a_flip_is_held_to_fp32_bounds():
    A, B = bf16_with_flips(5)
    A["updates"][0]["metrics"]["grad_norm"] *= 1 + 2e-4  # update 1 replays batch 0, which no flip reached
    v = compare.verdict(A, B)
    assert not v["ok"] and compare.failures(v)[0].startswith("grad_norm (update 1)"), compare.failures(v)


def test_flips_in_fp32_mode_fail():
    B = reference("fp32")
    A = project(B)
    A["rollouts"][1]["latents"] = flip(B["rollouts"][1]["latents"].bfloat16().float(), 5)
    B["rollouts"][1]["latents"] = B["rollouts"][1]["latents"].bfloat16().float()
    assert not compare.verdict(A, B)["ok"]


def test_a_flip_on_another_rank_reaches_this_ranks_updates(tmp_path):
    """The ranks share the gradient: a flip in rank 1's batch 1 lets rank 0's update 2 move by bf16 amounts."""
    B0 = reference("bf16")
    A0 = project(B0)
    A0["updates"][1]["metrics"]["grad_norm"] *= 1 + 2e-4
    A1, B1 = bf16_with_flips(5)
    for name, record in (("a.pt", A0), ("b.pt", B0), ("a.pt.rank1", A1), ("b.pt.rank1", B1)):
        torch.save(record, tmp_path / name)
    assert not compare.verdict(A0, B0)["ok"]
    assert compare.run_verdict(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))["ok"]
    assert compare.run_verdict(str(tmp_path / "a.pt.rank1"), str(tmp_path / "b.pt.rank1"))["ok"]


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda A: A["updates"][1].__setitem__("replayed", 0), "update 2: replayed 0 / 1"),
        (lambda A: A["updates"][2]["metrics"].__setitem__("ppo_clip_range", 1e-2), "update 3: clip range"),
        (lambda A: A.__setitem__("total", 4), "total (lr schedule) 4 / 3"),
        (lambda A: A["rollouts"][0].__setitem__("members", [1, 0, 2, 3]), "batch 0: members"),
        (lambda A: A.__setitem__("side", "videogrpo-traj-bf16"), "the project side ran in bf16 mode"),
    ],
)
def test_any_schedule_or_mode_difference_fails(change, named):
    B = reference("fp32")
    A = project(B)
    change(A)
    v = compare.verdict(A, B)
    assert not v["ok"] and any(p.startswith(named) for p in v["problems"]), v["problems"]


def run_command(argv: list[str], capsys) -> tuple[int, str]:
    try:
        ref_diff.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().out


def test_compare_and_summary_exit_non_zero_on_a_failure(tmp_path, capsys):
    for mode in ("fp32", "bf16"):
        B = reference(mode)
        A = project(B)
        torch.save(A, tmp_path / f"ok_{mode}_a.pt")
        torch.save(B, tmp_path / f"ok_{mode}_b.pt")
        A["updates"][2]["metrics"]["kl_loss"] *= 1.001
        torch.save(A, tmp_path / f"bad_{mode}_a.pt")
        torch.save(B, tmp_path / f"bad_{mode}_b.pt")
    code, out = run_command(["compare", str(tmp_path / "ok_fp32_a.pt"), str(tmp_path / "ok_fp32_b.pt")], capsys)
    assert code == 0 and out.splitlines()[-1].startswith("PASS (fp32): closest ")
    code, out = run_command(["compare", str(tmp_path / "bad_bf16_a.pt"), str(tmp_path / "bad_bf16_b.pt")], capsys)
    assert code == 1 and out.splitlines()[-1].startswith("FAIL (bf16): kl_loss (update 3): 2.00e-05 > 4.01e-08")

    def item(label, name, mode):
        return f"{label} {mode}={tmp_path / f'{name}_{mode}_a.pt'}:{tmp_path / f'{name}_{mode}_b.pt'}"

    everything = [item("one", "ok", "fp32"), item("one", "ok", "bf16"), item("two", "bad", "fp32")]
    code, out = run_command(["summary", *everything, item("two", "ok", "bf16")], capsys)
    lines = out.splitlines()
    assert code == 1, out
    assert lines[2].split("|")[-2].strip().startswith("PASS (0.") and lines[4].split("|")[-2].strip().startswith(
        "FAIL: kl_loss (update 3)"
    )
    assert lines[-1] == "FAIL: bf16 2 of 2 pass; fp32 1 of 2 pass (FAIL: two fp32)"
    code, out = run_command(["summary", item("one", "ok", "fp32"), item("one", "ok", "bf16")], capsys)
    assert code == 0 and out.splitlines()[-1] == "PASS: bf16 1 of 1 pass; fp32 1 of 1 pass"


def test_plan_compare_exits_non_zero_on_any_schedule_difference(tmp_path, capsys):
    update = dict(update=1, replayed=0, rolled_out=[0], staleness=0, flush=False, clip=1e-3, lr=1e-4)
    plan = [dict(point=dict(batches=1), total=1, updates=[update])]
    (tmp_path / "a.json").write_text(json.dumps(plan))
    (tmp_path / "b.json").write_text(json.dumps(plan))
    assert run_command(["plan-compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], capsys)[0] == 0
    plan[0]["updates"][0]["staleness"] = 1
    (tmp_path / "b.json").write_text(json.dumps(plan))
    code, out = run_command(["plan-compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], capsys)
    assert code == 1 and "update 1: staleness 0 / 1" in out


def test_the_stored_check_fails_a_changed_advantage_epsilon():
    """The stored comparisons hold the reference's results; the project side moved as a std epsilon of 2e-4 moves
    it (grad norm by 2.8e-4 relative) fails in both modes, since no stored run has a bf16 flip."""
    for path in sorted((REPO / "tests/data/ref_diff").glob("*.pt")):
        s = torch.load(path)
        assert not stored.check(s["reference"], s["reference"], s["mode"])[0]
        moved = copy.deepcopy(s["reference"])
        moved["updates"][0]["metrics"]["grad_norm"] *= 1 + 2.8e-4
        problems, _ = stored.check(moved, s["reference"], s["mode"])
        assert problems and problems[0].startswith("grad_norm (update 1)"), (path.name, problems)


STAND_IN = r"""#!/usr/bin/env bash
# Stands in for both sides' python: records its arguments, answers what run_all.sh greps for, and fails the
# comparisons whose file names contain $STAND_IN_FAIL, and crashes in the step $STAND_IN_CRASH names.
{ printf '<%s>' "$@"; echo; } >> "$STAND_IN_LOG"
case "$2" in
  "${STAND_IN_CRASH:-none}") echo "Traceback: stand-in crash"; exit 1 ;;
  probe) echo "(a) stand-in" ;;
  plan-reference) echo "plan-reference: stand-in" ;;
  split-reference) echo "split-reference: stand-in" ;;
  inputs) echo "inputs: stand-in" ;;
  compare) if [ -n "${STAND_IN_FAIL:-}" ] && [[ "$3" == *"$STAND_IN_FAIL"* ]]; then echo "FAIL (fp32): x"; exit 1; fi ;;
  summary) echo "| the summary |"; [ -z "${STAND_IN_FAIL:-}" ] || exit 1 ;;
esac
exit 0
"""


def run_all(tmp_path, reference, **env):
    """run_all.sh on `reference` with the stand-in python for both sides, one mode, no 2-rank runs."""
    work = tmp_path / "work"
    (work / ".venv/bin").mkdir(parents=True, exist_ok=True)
    stand_in = work / ".venv/bin/python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    (work / ".venv/complete").touch()
    settings, env = (
        env,
        {k: v for k, v in os.environ.items() if k not in ("REF_COMMIT", "STAND_IN_FAIL", "STAND_IN_CRASH")},
    )
    env.update(PROJECT_PY=str(stand_in), STAND_IN_LOG=str(tmp_path / "argv.log"), WORLD2="0", MODES="fp32")
    env.update(settings)
    out = subprocess.run(
        ["bash", str(TOOL / "run_all.sh"), str(reference), str(work)], env=env, capture_output=True, text=True
    )
    log = (tmp_path / "argv.log").read_text().splitlines() if (tmp_path / "argv.log").exists() else []
    return out, log


@pytest.fixture
def plain_tree(tmp_path):
    tree = tmp_path / "vbvr-rl"
    (tree / "src/trainer").mkdir(parents=True)
    (tree / "src/trainer/dancegrpo_trainer.py").write_text("")
    return tree


def test_run_all_refuses_ref_commit_with_a_plain_tree(tmp_path, plain_tree):
    out, log = run_all(tmp_path, plain_tree, REF_COMMIT="252c2ff")
    assert out.returncode == 2 and not log, out.stdout + out.stderr
    assert f"REF_COMMIT=252c2ff asks for a commit, but {plain_tree} is a plain tree" in out.stderr


def test_run_all_passes_a_plain_trees_commit_as_one_argument(tmp_path, plain_tree):
    out, log = run_all(tmp_path, plain_tree)
    assert out.returncode == 0, out.stdout + out.stderr
    stores = [line for line in log if "<store>" in line]
    assert len(stores) == 4 and all("<--reference-commit=unknown (not a git checkout)>" in x for x in stores), stores
    assert "| the summary |" in out.stdout and out.stdout.rstrip().endswith(
        "PASS: every comparison within its tolerances"
    )


def test_run_all_prints_the_summary_then_exits_non_zero_on_a_failed_comparison(tmp_path, plain_tree):
    out, log = run_all(tmp_path, plain_tree, STAND_IN_FAIL="multi_flowcps")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "| the summary |" in out.stdout and any("<summary>" in line for line in log)
    assert "a14b_dancegrpo" in out.stdout  # the runs after the failing one ran too
    assert "FAIL: 1 comparison(s) broke a tolerance: multi_flowcps fp32;" in out.stderr


@pytest.mark.parametrize("step", ["plan-videogrpo", "inputs", "videogrpo"])
def test_run_all_exits_2_when_a_step_crashes(tmp_path, plain_tree, step):
    """1 means a comparison failed; a step that could not run is 2, whether or not the script names it."""
    out, log = run_all(tmp_path, plain_tree, STAND_IN_CRASH=step)
    assert out.returncode == 2, out.stdout + out.stderr
    assert not any("<summary>" in line for line in log)


def test_run_all_refuses_a_work_folder_holding_another_commit(tmp_path):
    repo = tmp_path / "mirror"
    (repo / "src/trainer").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for n in ("1", "2"):
        (repo / "src/trainer/version.py").write_text(n)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", n], check=True)
    out, _ = run_all(tmp_path, repo, REF_COMMIT="HEAD~1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "work/vbvr-rl/src/trainer/version.py").read_text() == "1"
    out, log = run_all(tmp_path, repo, REF_COMMIT="HEAD")
    assert out.returncode == 2 and "remove" in out.stderr and "vbvr-rl" in out.stderr, out.stderr
