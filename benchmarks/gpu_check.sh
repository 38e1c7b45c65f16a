#!/usr/bin/env bash
# Run on a lent GPU machine from the source tree (no pip install there): checks every kernel
# against its reference on CUDA, times eager / compiled / Triton per step, and writes
# benchmarks/results/gpu_check.{txt,json}. Designed to finish in under 5 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/ldverify_inductor}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout "${GPU_CHECK_TIMEOUT:-290}" python -m benchmarks.gpu_check "$@"
status=$?
mkdir -p "${OUT:-/tmp}" && cp benchmarks/results/gpu_check*.{txt,json} "${OUT:-/tmp}/" 2>/dev/null
exit $status
