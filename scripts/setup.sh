#!/usr/bin/env bash
# Create .venv (if missing) and install flashstate into it. Usage: scripts/setup.sh [extras], e.g. "test".
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
# The CPU wheel of torch is on disk; asking for it by version keeps pip off the multi-GB CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
if [ -n "$extras" ]; then
  python -m pip install -q -e ".[$extras]"
else
  python -m pip install -q -e .
fi
