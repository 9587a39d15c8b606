"""benchmarks/gpu/host_restore.py runs its CPU fallback end to end (tiny preset, pageable memory) and
reports a host restore of every prompt token."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_host_restore_script_cpu_fallback(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    argv = ["--device", "cpu", "--tokens", "600", "--crc", "zlib", "--host-chunk-tokens", "256"]
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu/host_restore.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "host_restore.json").read_text())
    assert result["preset"] == "tiny" and result["tokens"] == 600 and result["device"] == "cpu"
    assert result["crc"] == "zlib" and result["host_chunk_tokens"] == 256
    assert result["state_bytes"] > 0 and result["restore_seconds"] > 0 and result["prefill_seconds"] > 0
    assert "h2d_pinned_gb_per_s" not in result  # no pinned memory without CUDA
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| write-back")
