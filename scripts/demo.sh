#!/usr/bin/env bash
# Set up from nothing and run the main job on the embedded default model and workload.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
exec .venv/bin/flashstate demo "$@"
