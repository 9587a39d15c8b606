#!/usr/bin/env bash
# Set up from nothing and run the whole test suite (lint included).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Mooncake store client (host-tier tests start a real mooncake_master) needs libibverbs.so.1:
# installed here when missing, on CI or as root.
if ! { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  if [ "$(id -u)" = 0 ] || [ "${CI:-}" = true ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq libibverbs1 >/dev/null 2>&1 \
      || { $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq libibverbs1 >/dev/null; }
  else
    echo "scripts/test.sh: libibverbs1 is missing (apt-get install -y libibverbs1); mooncake tests will fail" >&2
  fi
fi
bash scripts/setup.sh test
.venv/bin/ruff check flashstate tests benchmarks
exec .venv/bin/python -m pytest -q "$@"
