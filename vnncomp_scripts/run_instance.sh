#!/bin/bash
# VNN-COMP: run_instance.sh v1 CATEGORY ONNX VNNLIB RESULTS_FILE TIMEOUT -- writes "timeout" to
# the results file first (what a run killed at its timeout leaves), then the answer (sat with its
# counterexample, unsat, timeout or unknown) through a rename. The time since this script
# started (Python's imports) counts against TIMEOUT.
STARTED=$(date +%s.%N)
if [ "${1:-}" != "v1" ]; then
    echo "Expected first argument (version string) 'v1', got '${1:-}'"
    exit 1
fi
CATEGORY=$2
# Several networks (VNN-COMP 2026: "a.onnx;b.onnx"): each path made absolute.
absolute_paths() {
    local IFS=';' out=() part
    for part in $1; do out+=("$(realpath -m "$part")"); done
    echo "${out[*]}"
}
ONNX_FILE=$(absolute_paths "$3")
VNNLIB_FILE=$(realpath "$4")
RESULTS_FILE=$(realpath "$5")
TIMEOUT=$6
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${LDVERIFY_CACHE:-${TMPDIR:-/tmp}/ldverify_vnncomp}"
echo "timeout" > "$RESULTS_FILE"
echo "Running ldverify on '$CATEGORY': $ONNX_FILE, $VNNLIB_FILE, timeout $TIMEOUT s"
mkdir -p "$CACHE"
cd "$ROOT" || exit 1
python -m verify run "$ONNX_FILE" "$VNNLIB_FILE" --timeout "$TIMEOUT" \
    --results-file "$RESULTS_FILE" --cache "$CACHE" --started-at "$STARTED" &
PID=$!
echo "$PID" > "$CACHE/run.pid"  # for prepare_instance.sh, should this run outlive its kill
wait "$PID"
STATUS=$?
rm -f "$CACHE/run.pid"
if [ $STATUS -ne 0 ]; then
    echo "error" > "$RESULTS_FILE"
fi
exit 0
