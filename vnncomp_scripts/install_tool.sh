#!/bin/bash
# VNN-COMP: install_tool.sh v1 -- installs ldverify with the README's first command (which also
# runs the quickstart, a check that the install works).
set -euo pipefail
if [ "${1:-}" != "v1" ]; then
    echo "Expected first argument (version string) 'v1', got '${1:-}'"
    exit 1
fi
cd "$(dirname "$0")/.."
pip install --no-compile -e ".[dev]" -c constraints-cpu.txt && python examples/quickstart.py
