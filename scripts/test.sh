#!/usr/bin/env bash
# Set up from nothing and run the whole test suite (lint included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check flashstate tests benchmarks
exec .venv/bin/python -m pytest -q "$@"
