#!/usr/bin/env bash
# One lent-GPU session: the kernel/step checks (gpu_check.sh), then branch and bound on CUDA over
# an instance list (default: none). Everything lands in $OUT (or /tmp) as it is written.
#   BAB_CSV=path/instances.csv BAB_ROOT=dir BAB_SCALE=0.05 bash benchmarks/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
mkdir -p "$out"
GPU_CHECK_TIMEOUT="${GPU_CHECK_TIMEOUT:-240}" bash benchmarks/gpu_check.sh
check=$?
bab=0
if [ -n "${BAB_CSV:-}" ]; then
  python - <<'PY'
import torch
print("cuda", torch.cuda.is_available(), torch.__version__)
PY
  timeout "${BAB_TIMEOUT:-200}" python -m verify run-all "$BAB_CSV" --root "$BAB_ROOT" \
    --out "$out/bab_cuda.csv" --device cuda --timeout-scale "${BAB_SCALE:-0.05}" 2>&1 | tee "$out/bab_cuda.log"
  bab=$?
fi
exit $(( check | bab ))
