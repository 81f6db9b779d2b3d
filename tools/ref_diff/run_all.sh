#!/usr/bin/env bash
# The full comparison of this project's GRPO trainer with the reference's (README.md beside this file).
#
#   tools/ref_diff/run_all.sh REFERENCE [WORK]
#
# REFERENCE: a checkout of pufanyi/vbvr-rl or its git directory (a bare mirror will do), or a plain copy of its
# tree; REF_COMMIT names the commit to compare (default HEAD; the measured one is 252c2ff), and is refused with a
# plain tree, which has no commits to check out. WORK: the scratch folder (default $DIFF_WORK, else a new
# temporary one); what is already there (the reference's tree and venv, the tiny models) is reused. PROJECT_PY:
# the project's python (default .venv/bin/python of this checkout, else python3); the project side imports this
# checkout's src/. WORLD2=0 skips the 2-rank runs (data parallel and tensor parallel); MODES="fp32" runs one
# precision mode.
#
# Exit status: 0 when every comparison passes its tolerances; 1 when any fails (each failing comparison says
# what broke its tolerance, and the summary table is printed first all the same); 2 when the comparison could not
# be run (a refused REFERENCE or REF_COMMIT, a side that crashed: its log's tail is printed; any other step
# that failed).
set -eEuo pipefail
# Any step that fails outside the comparisons' verdicts (a side, the probes, the inputs) means the run could not be
# made: exit 2, so that 1 always means a comparison failed.
trap 'echo "run_all.sh: stopped: line $LINENO failed (exit status 2: the comparison could not be run)" >&2; exit 2' ERR
[ $# -ge 1 ] || { echo "usage: run_all.sh REFERENCE [WORK]" >&2; exit 2; }
REF=$1
REF=$(cd "$REF" && pwd)
D=${2:-${DIFF_WORK:-$(mktemp -d)}}
mkdir -p "$D" && D=$(cd "$D" && pwd)
H=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$H/../.." && pwd)
P=${PROJECT_PY:-$REPO/.venv/bin/python}
[ -x "$P" ] || P=$(command -v python3)
V=$D/.venv/bin/python
S=$H/ref_diff.py
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
export DIFF_WORK=$D OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONDONTWRITEBYTECODE=1 PYTHONWARNINGS=ignore
export PYTHONPATH=$REPO/src${PYTHONPATH:+:$PYTHONPATH} VBVR_RL_ROOT=$D/vbvr-rl
START=$(date +%s)
cd "$D"
crashed() { tail -30 "$1"; echo "run_all.sh: $2 failed to run (log: $D/$1)" >&2; exit 2; }

# The reference's tree: the commit's tree out of a git checkout or git directory (REF_COMMIT, default HEAD), or a
# plain copy of a tree that is not in git. A WORK that already has one keeps it (remove WORK/vbvr-rl to change),
# but only when it is the commit asked for.
if [ -e "$REF/.git" ] || [ "$(git -C "$REF" rev-parse --is-bare-repository 2>/dev/null)" = true ]; then
  WANT=$(git -C "$REF" rev-parse --verify "${REF_COMMIT:-HEAD}^{commit}") || {
    echo "run_all.sh: REF_COMMIT=${REF_COMMIT:-HEAD} is not a commit of $REF" >&2; exit 2; }
elif [ -d "$REF/src/trainer" ]; then
  if [ -n "${REF_COMMIT:-}" ]; then
    echo "run_all.sh: REF_COMMIT=$REF_COMMIT asks for a commit, but $REF is a plain tree (not a git checkout or" \
      "git directory), so no commit can be checked out of it. Point REFERENCE at a clone or a bare mirror of" \
      "pufanyi/vbvr-rl to compare that commit, or unset REF_COMMIT to compare this tree as it is." >&2
    exit 2
  fi
  WANT="unknown (not a git checkout)"
else
  echo "run_all.sh: $REF: neither a checkout of the reference nor its git directory" >&2; exit 2
fi
if [ -d vbvr-rl/src/trainer ] && [ "$(cat reference_commit 2>/dev/null)" != "$WANT" ]; then
  echo "run_all.sh: $D/vbvr-rl holds the reference at $(cat reference_commit 2>/dev/null || echo unknown)," \
    "not $WANT: remove $D/vbvr-rl (or use another WORK) to compare $WANT" >&2
  exit 2
fi
if [ ! -d vbvr-rl/src/trainer ]; then
  rm -rf vbvr-rl && mkdir -p vbvr-rl
  if [ "$WANT" = "unknown (not a git checkout)" ]; then
    cp -r "$REF/." vbvr-rl/
  else
    git -C "$REF" archive "$WANT" | tar -x -C vbvr-rl
  fi
  echo "$WANT" > reference_commit
fi
echo "reference: $REF at $(cat reference_commit 2>/dev/null || echo unknown); work folder $D"

# The reference's environment: its lock file's pins for what its trainer imports, and the CPU build of torch.
if [ ! -f .venv/complete ]; then
  echo "=== building the reference's environment in $D/.venv (python3.11, $TORCH_SPEC, pins of vbvr-rl/uv.lock)"
  rm -rf .venv && python3.11 -m venv .venv
  { .venv/bin/pip install -q "$TORCH_SPEC" && .venv/bin/pip install -q $(python3.11 "$H/reference_pins.py" vbvr-rl); } \
    > pip.log 2>&1 || crashed pip.log "building the reference's environment"
  touch .venv/complete
fi
$P "$S" models > models.log 2>&1 || crashed models.log "building the tiny models"
mkdir -p cmp

echo "=== probes: the reference's own rollout, replay, loss and expert routing on the tiny models"
$V "$S" probe 2>&1 | grep -E '^\((a|b|c|d)\)'

echo "=== schedules: which batch each update rolls out and replays, staleness, flush, clip range, lr"
$P "$S" plan-videogrpo cmp/plan_videogrpo.json
$V "$S" plan-reference cmp/plan_reference.json 2>&1 | grep '^plan-reference'
# A comparison that fails is noted and the rest still run, so that the summary shows every verdict at once.
FAILED=()
$V "$S" plan-compare cmp/plan_videogrpo.json cmp/plan_reference.json || FAILED+=("the schedule grid")

echo "=== rollout actors, asynchronous: each step's creation and policy version against the reference's own loop"
$P "$S" split-videogrpo cmp/split_videogrpo.json
$V "$S" split-reference cmp/split_reference.json 2>&1 | grep '^split-reference'
$V "$S" split-compare cmp/split_videogrpo.json cmp/split_reference.json || FAILED+=("the split schedule")
mkdir -p stored && $V "$S" split-store stored/split_schedule.json cmp/split_reference.json "$(cat reference_commit)"

torchrun() { local py=$1; shift; $py -m torch.distributed.run --standalone --nproc-per-node=2 "$@"; }
SUMMARY=()
# pair NAME WORLD INPUT-FLAGS...: the inputs, then both sides in each mode, then their comparison
pair() {
  local n=$1 w=$2; shift 2
  $P "$S" inputs cmp/$n.in.pt --world=$w "$@" 2>&1 | grep '^inputs' | cut -c1-200
  for v in ${MODES:-fp32 bf16}; do
    if [ $v = fp32 ]; then fa=""; fb="--fp32"; else fa="--traj-bf16"; fb=""; fi
    local a=cmp/$n.videogrpo_$v.pt b=cmp/$n.reference_$v.pt
    if [ $w = 1 ]; then
      $P "$S" videogrpo cmp/$n.in.pt $a $fa > $a.log 2>&1 || crashed $a.log "the project side of $n ($v)"
      $V "$S" reference cmp/$n.in.pt $b $fb > $b.log 2>&1 || crashed $b.log "the reference side of $n ($v)"
    else
      torchrun $P "$S" videogrpo cmp/$n.in.pt $a $fa > $a.log 2>&1 || crashed $a.log "the project side of $n ($v)"
      torchrun $V "$S" reference cmp/$n.in.pt $b $fb > $b.log 2>&1 || crashed $b.log "the reference side of $n ($v)"
    fi
    if [ $v = fp32 ]; then echo "=== $n: fp32 (project grpo.trajectory_dtype float32; reference --fp32)"
    else echo "=== $n: bf16 (project grpo.trajectory_dtype bfloat16; reference as shipped)"; fi
    $V "$S" compare $a $b || FAILED+=("$n $v")
    SUMMARY+=("$n $v=$a:$b")
    [ $w = 1 ] || SUMMARY+=("$n rank1 $v=$a.rank1:$b.rank1")
  done
}
# One update: dancegrpo eta 0.3, flowcps eta 0.7.
pair one_dancegrpo 1 --sampler=dancegrpo --eta=0.3
pair one_flowcps 1 --sampler=flowcps --eta=0.7
# Several updates: warm-up 2 then cosine over 6, AdamW moments carried, KL active (perturbed policy), the gradient
# clip active on some updates (dancegrpo), 2 of 3 timesteps replayed per update.
pair multi_dancegrpo 1 --sampler=dancegrpo --eta=0.3 --updates=6 --warmup=2 --fraction=0.7 --perturb=0.05 --max_grad_norm=0.14
pair multi_flowcps 1 --sampler=flowcps --eta=0.7 --updates=6 --warmup=2 --fraction=0.7 --perturb=0.05
# One-step-delayed replay (shared-prompt mode): 4 batches x 2 epochs (a prefill and a skipped batch per epoch),
# delayed clip range 1e-2; peak lr 1e-2 so that the stale replays' ratios leave the clip range.
pair delayed_dancegrpo 1 --sampler=dancegrpo --eta=0.3 --delayed --batches=4 --epochs=2 --warmup=2 --fraction=0.7 --perturb=0.05 --lr=1e-2
# A14B: the two-expert I2V model (high-noise expert above the boundary, low-noise below), the reference's standard
# path. Flow-CPS with one eta per prompt, one replayed timestep per update (so some updates train one expert
# only); dancegrpo with two timesteps per update and the joint gradient clip active.
pair a14b_flowcps_eta_range 1 --kind=i2v_a14b --sampler=flowcps --eta_range=0.5,0.9 --updates=6 --warmup=2 --fraction=0.4 --perturb=0.05
pair a14b_dancegrpo 1 --kind=i2v_a14b --sampler=dancegrpo --eta=0.3 --updates=3 --warmup=1 --fraction=0.7 --perturb=0.05 --max_grad_norm=0.05
if [ "${WORLD2:-1}" != 0 ]; then
  # 2 gloo ranks sharing each prompt's group: plain replication (all-reduce) and FSDP2 with delayed replay.
  pair world2_dancegrpo 2 --sampler=dancegrpo --eta=0.3 --updates=3 --warmup=1 --fraction=0.7 --perturb=0.05
  pair world2_fsdp_delayed_flowcps 2 --sampler=flowcps --eta=0.7 --delayed --batches=3 --epochs=2 --warmup=1 --fraction=0.7 --perturb=0.05 --fsdp=1
  # Tensor parallelism: one TP pair (TP 2 x FSDP2 over 1 data replica), both trainers' standard path; TI2V, and A14B
  # with one eta per prompt and one replayed timestep per update.
  pair tp2_dancegrpo 2 --tp=2 --fsdp=1 --sampler=dancegrpo --eta=0.3 --updates=3 --warmup=1 --fraction=0.7 --perturb=0.05
  pair tp2_a14b_flowcps_eta_range 2 --tp=2 --fsdp=1 --kind=i2v_a14b --sampler=flowcps --eta_range=0.5,0.9 --updates=3 --warmup=1 --fraction=0.4 --perturb=0.05
fi
# The stored comparisons of tests/test_ref_diff.py: small inputs and the reference's results on them, checked against
# the project side here; `cp $WORK/stored/*.pt tests/data/ref_diff/` refreshes the test's copies.
mkdir -p stored
PROJECT_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
stored() {
  local n=$1 v=$2; shift 2
  if [ $v = fp32 ]; then fa=""; fb="--fp32"; else fa="--traj-bf16"; fb=""; fi
  local i=cmp/stored_$n.in.pt a=cmp/stored_$n.videogrpo.pt b=cmp/stored_$n.reference.pt
  $P "$S" inputs $i "$@" > $i.log 2>&1 || crashed $i.log "the inputs of stored $n"
  $P "$S" videogrpo $i $a $fa > $a.log 2>&1 || crashed $a.log "the project side of stored $n"
  $V "$S" reference $i $b $fb > $b.log 2>&1 || crashed $b.log "the reference side of stored $n"
  $V "$S" store stored/$n.pt $i $a $b $v --project-commit="$PROJECT_COMMIT" --reference-commit="$(cat reference_commit)" \
    || FAILED+=("stored $n")
}
echo "=== stored comparisons (tests/data/ref_diff)"
stored ti2v_dancegrpo_fp32 fp32 --sampler=dancegrpo --eta=0.3 --updates=2 --warmup=1 --fraction=0.7 --perturb=0.05 --max_grad_norm=0.1
stored ti2v_flowcps_delayed_fp32 fp32 --sampler=flowcps --eta=0.7 --delayed --batches=3 --fraction=0.7 --perturb=0.05 --lr=1e-3 --delayed_clip_range=1e-4
stored ti2v_flowcps_delayed_bf16 bf16 --sampler=flowcps --eta=0.7 --delayed --batches=3 --fraction=0.7 --perturb=0.05 --lr=1e-3 --delayed_clip_range=1e-4
stored a14b_flowcps_eta_range_fp32 fp32 --kind=i2v_a14b --sampler=flowcps --eta_range=0.5,0.9 --updates=2 --fraction=0.4 --perturb=0.05
echo "=== summary: largest |project - reference| over all rolled-out batches and updates, and each run's verdict"
# The summary's verdicts are the compares' own (FAILED has them); it fails on its own only if it cannot read them.
$V "$S" summary "${SUMMARY[@]}" > summary.md || [ ${#FAILED[@]} -gt 0 ] || FAILED+=("the summary")
cat summary.md
echo "full comparison in $(( $(date +%s) - START )) s"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAIL: ${#FAILED[@]} comparison(s) broke a tolerance: $(printf '%s; ' "${FAILED[@]}")" >&2
  exit 1
fi
echo "PASS: every comparison within its tolerances"
