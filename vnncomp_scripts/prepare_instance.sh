#!/bin/bash
# VNN-COMP: prepare_instance.sh v1 CATEGORY ONNX VNNLIB -- converts and checks the network and
# the property and caches them for run_instance.sh (exit 0); a network or property ldverify
# refuses exits 1 with the reason, so the instance is skipped rather than answered wrongly.
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
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${LDVERIFY_CACHE:-${TMPDIR:-/tmp}/ldverify_vnncomp}"
echo "Preparing ldverify for '$CATEGORY': $ONNX_FILE, $VNNLIB_FILE"
# A run left over from a killed instance: the one run_instance.sh recorded (its PID file),
# and only while that process is still a `verify run` (nothing else on the machine).
if [ -f "$CACHE/run.pid" ]; then
    PID=$(cat "$CACHE/run.pid")
    if tr '\0' ' ' < "/proc/$PID/cmdline" 2>/dev/null | grep -q -- "-m verify run "; then
        kill "$PID" 2>/dev/null
    fi
    rm -f "$CACHE/run.pid"
fi
cd "$ROOT" && python -m verify prepare "$ONNX_FILE" "$VNNLIB_FILE" --cache "$CACHE" || exit 1
exit 0
