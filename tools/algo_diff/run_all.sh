#!/usr/bin/env bash
# Every algo_diff comparison, against checkouts of the three authors' repositories (README.md beside this file).
#
#   tools/algo_diff/run_all.sh FLOW_GRPO MIXGRPO DIFFUSION_NFT [PROMPTRL UNIRL]
#
# Each argument: a clone, a git directory (a bare mirror will do) or a plain copy of the tree of yifan123/flow_grpo,
# Tencent-Hunyuan/MixGRPO and NVlabs/DiffusionNFT; PROMPTRL and UNIRL (optional, both or neither): G-U-N/UniRL's
# prompt_rl branch and Tencent-Hunyuan/UniRL, for the prompt refiner's loss (PROMPTRL_COMMIT, UNIRL_COMMIT; the
# stored outputs are of 53c28c9 and 1a7b501). FLOW_GRPO_COMMIT, MIXGRPO_COMMIT and DIFFUSION_NFT_COMMIT pick the
# commit of a clone or git directory (default HEAD; the stored outputs are of 9745241, e5cdd6a and 24af555).
# PROJECT_PY: the project's python (default .venv/bin/python of this checkout, else python3); the tools import this
# checkout's src/.
#
# Exit status: 0 when every comparison is within round-off; 1 when one is not (the table says which); 2 when one
# could not be run (a checkout that is missing or lacks the file a tool loads: its message is printed).
set -uo pipefail
[ $# -eq 3 ] || [ $# -eq 5 ] || { echo "usage: run_all.sh FLOW_GRPO MIXGRPO DIFFUSION_NFT [PROMPTRL UNIRL]" >&2; exit 2; }
H=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$H/../.." && pwd)
P=${PROJECT_PY:-$REPO/.venv/bin/python}
[ -x "$P" ] || P=$(command -v python3)
export PYTHONPATH=$REPO/src${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
declare -A CHECKOUT=([flow_grpo]=$1 [MixGRPO]=$2 [DiffusionNFT]=$3)
declare -A COMMIT=([flow_grpo]=${FLOW_GRPO_COMMIT:-HEAD} [MixGRPO]=${MIXGRPO_COMMIT:-HEAD}
  [DiffusionNFT]=${DIFFUSION_NFT_COMMIT:-HEAD})
# Each tool and the repository whose code it runs, kernels first, then the whole steps.
TOOLS="flow_grpo_steps:flow_grpo grpo_guard:flow_grpo advantages:flow_grpo weight_ema:flow_grpo
  mixgrpo_window:MixGRPO mixgrpo_tail:MixGRPO diffusion_nft:DiffusionNFT nft_rollout:DiffusionNFT
  fast_step:flow_grpo guard_step:flow_grpo mixgrpo_step:MixGRPO nft_step:DiffusionNFT"
worst=0
summary=""
for entry in $TOOLS; do
  tool=${entry%%:*} repo=${entry#*:}
  echo "== $tool.py against $repo (${CHECKOUT[$repo]} at ${COMMIT[$repo]})"
  "$P" "$H/$tool.py" "${CHECKOUT[$repo]}" --commit "${COMMIT[$repo]}" 2>&1 | grep -v "^\[transformers\]"
  status=${PIPESTATUS[0]}
  case $status in 0) verdict=PASS ;; 1) verdict=FAIL ;; *) verdict="COULD NOT RUN"; status=2 ;; esac
  summary+=$(printf '\n  %-16s %-13s %s' "$tool" "$repo" "$verdict")
  [ "$status" -gt "$worst" ] && worst=$status
done
if [ $# -eq 5 ]; then
  echo "== refiner_lm.py against PromptRL ($4 at ${PROMPTRL_COMMIT:-HEAD}) and UniRL ($5 at ${UNIRL_COMMIT:-HEAD})"
  "$P" "$H/refiner_lm.py" "$4" "$5" --promptrl-commit "${PROMPTRL_COMMIT:-HEAD}" --unirl-commit "${UNIRL_COMMIT:-HEAD}"
  status=$?
  case $status in 0) verdict=PASS ;; 1) verdict=FAIL ;; *) verdict="COULD NOT RUN"; status=2 ;; esac
  summary+=$(printf '\n  %-16s %-13s %s' refiner_lm "UniRL x2" "$verdict")
  [ "$status" -gt "$worst" ] && worst=$status
fi
echo
echo "summary:$summary"
exit "$worst"
