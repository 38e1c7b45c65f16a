#!/usr/bin/env bash
# One lent-GPU session: the kernel/step checks (gpu_check.sh), the CUDA tests, branch and bound on
# CUDA over an instance list (default: none) and the monitors' latency on CUDA (gpu_monitor.py).
# Everything lands in $OUT (or /tmp) as it is written; each part has its own time limit.
#   BAB_CSV=path/instances.csv BAB_ROOT=dir BAB_SCALE=0.05 bash benchmarks/gpu_session.sh
#   PARTS="check tests bab monitor" (default: all four)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
mkdir -p "$out"
parts=" ${PARTS:-check tests bab monitor} "
status=0
python -c 'import torch; print("cuda", torch.cuda.is_available(), torch.__version__)'
if [[ $parts == *" check "* ]]; then
  GPU_CHECK_TIMEOUT="${GPU_CHECK_TIMEOUT:-240}" bash benchmarks/gpu_check.sh || status=1
fi
if [[ $parts == *" tests "* ]]; then
  timeout "${TESTS_TIMEOUT:-120}" python -m pytest -q -x -p no:cacheprovider tests/test_cuda.py \
    tests/kernels 2>&1 | tee "$out/cuda_tests.log" || status=1
fi
if [[ $parts == *" bab "* && -n "${BAB_CSV:-}" ]]; then
  timeout "${BAB_TIMEOUT:-200}" python -m verify run-all "$BAB_CSV" --root "$BAB_ROOT" \
    --out "$out/bab_cuda.csv" --device cuda --timeout-scale "${BAB_SCALE:-0.05}" 2>&1 \
    | tee "$out/bab_cuda.log" || status=1
fi
if [[ $parts == *" monitor "* ]]; then
  timeout "${MONITOR_TIMEOUT:-150}" python -m benchmarks.gpu_monitor --out "$out" || status=1
fi
exit $status
