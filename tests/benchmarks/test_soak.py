"""benchmarks/soak.py, bounded: 30 s of 4 agents' multi-turn chats against a real server with a 16M cache,
mixed with disconnects, aborts, oversized and malformed requests. No 5xx, every bad request a 4xx, nothing
leaked, every completed turn's text the same when replayed on a reset cache (or apart from a near tie: see
near_tie in the script), the server alive and healthy.
(RSS is measured, not asserted.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_has_no_5xx_no_leaks_and_no_mismatches(tmp_path):
    out = tmp_path / "soak.json"
    chaos = ["--p-misbehave", "0.3", "--p-abort", "0.2", "--p-disconnect", "0.1"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--duration", "30", "--agents", "4", *chaos]
    cmd += ["--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert out.exists(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["server_errors_5xx"] == 0, result["server_error_samples"]
    assert result["unexpected_count"] == 0, result["unexpected"]
    assert (result["leaked_blocks"], result["leaked_state_slots"], result["leaked_after_replay"]) == (0, 0, 0)
    assert result["completed_turns"] > 0 and result["replayed_turns"] == result["completed_turns"]
    assert result["mismatches"] == 0, result["mismatch_samples"]
    assert result["turns_without_logprobs"] == 0  # what tells a near tie apart
    assert result["server_alive"] and result["health_at_end"] == 200
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
