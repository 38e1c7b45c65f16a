#!/usr/bin/env bash
# Run on a lent GPU machine from the source tree (no pip install there): checks every kernel
# against its reference on CUDA, times eager / compiled / Triton per step, and writes
# benchmarks/results/gpu_check.{txt,json}. Designed to finish in under 5 minutes on an H200.
# Only the tables this run wrote are copied to $OUT (older gpu_check* results stay behind:
# they took two of the eight files a lent machine sends back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/ldverify_inductor}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
stamp="$(mktemp)"  # written before the run: the tables written after it are this run's
timeout "${GPU_CHECK_TIMEOUT:-290}" python -m benchmarks.gpu_check "$@"
status=$?
mkdir -p "${OUT:-/tmp}"
find benchmarks/results -maxdepth 1 -type f -name 'gpu_check*' \( -name '*.txt' -o -name '*.json' \) \
  -newer "$stamp" -exec cp {} "${OUT:-/tmp}/" \;
rm -f "$stamp"
exit $status
