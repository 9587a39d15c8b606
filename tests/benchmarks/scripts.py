"""Running a benchmark script the way its docstring says: from the repository, PYTHONPATH at its root."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python benchmarks/<script> args...`, its output captured (plots without a display)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    argv = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
