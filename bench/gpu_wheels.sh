#!/usr/bin/env bash
# Wheels the GPU smoke needs that a bare CUDA+PyTorch image lacks, at envs/gpu.lock.txt's versions, into
# .whl/ (git-ignored) for a machine that cannot reach a package index; bench/gpu_smoke.sh installs them.
#   bash bench/gpu_wheels.sh [python version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-3.12}
NAMES="diffusers importlib-metadata ftfy wcwidth av isal kernels transformers huggingface-hub opencv-python-headless tqdm"
pins=()
for name in $NAMES; do
  pins+=("$(grep -oiE "^${name}==[^ ]+" envs/gpu.lock.txt)")
done
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  "${platforms[@]}" -d .whl "${pins[@]}"
du -sh .whl
