#!/usr/bin/env bash
# The GPU checks of issue 17 on one GPU, at most 9 minutes (caps of 180 s + 360 s) on one H200: the GPU
# test tier (tests/gpu/), then bench/gpu_smoke.py (node, attention backends, torch.compile, GRPO updates
# at mid size and at the TI2V-5B transformer's real shape). Record the output in bench/RESULTS.md.
#   bash bench/gpu_smoke.sh [--no-5b]          # from the GPU environment (make gpu-env), on a GPU node
#   bash bench/gpu_smoke.sh --cpu              # the same script on CPU with small shapes (tests/test_gpu_smoke.py)
# On a machine without a package index, first run `bash bench/gpu_wheels.sh` where pip works and carry
# .whl/ along: its wheels are installed into /tmp/site here. Logs go to $OUT (default: a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
case " $* " in *" --cpu "*) cpu=1 ;; *) cpu=0 ;; esac
if [ "$cpu" = 0 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
start=$(date +%s)
timeout 180 python3 -m pytest tests/gpu -q -rA -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/gpu-tests.log"
tests=${PIPESTATUS[0]}
echo "tests/gpu: exit $tests after $(( $(date +%s) - start )) s"
timeout 360 python3 bench/gpu_smoke.py "$@" 2>&1 | tee "$OUT/gpu-smoke.log"
smoke=${PIPESTATUS[0]}
echo "gpu smoke: exit $smoke, $(( $(date +%s) - start )) s in all; logs in $OUT"
exit $(( tests || smoke ))
