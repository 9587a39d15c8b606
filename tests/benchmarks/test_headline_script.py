"""benchmarks/gpu/headline.sh on the CPU (tiny preset, two agents, a few seconds): a budget named by its
fraction of the working set on one trace half reaches the server as the bytes `flashstate working-set`
gives, and the replay uses that half. The script runs on the lent GPU, where a broken one costs device
time."""

import json
import os
import subprocess
import sys
from pathlib import Path

from flashstate.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_headline_names_its_budget_by_the_working_set(traces, tmp_path, capsys):
    scale = ["--agents", "2", "--length-scale", "0.01", "--max-context", "2048", "--max-output-tokens", "512"]
    half = ["--fractions", "0.5", "--trace-split", "tune"]
    assert main(["working-set", str(traces), "--model", "tiny", *scale, *half]) == 0
    want = json.loads(capsys.readouterr().out)["budgets"]["0.5"]
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "FLASHSTATE_TRACES": str(traces),
        "PRESET": "tiny",
        "DEVICE": "cpu",
        "DTYPE": "float32",
        "AGENTS": "2",
        "WARMUP": "0",
        "DURATION": "3",
        "DRAIN": "0",
        "LENGTH_SCALE": "0.01",
        "MAX_CONTEXT": "2048",
        "FRACTION": "0.5",
        "TRACE_SPLIT": "tune",
        "POLICIES": "none",
        "RESULTS": str(tmp_path),
    }
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", "benchmarks/gpu/headline.sh", "policies"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"budget {want} bytes = 0.5 x the working set of the tune half" in proc.stdout
    result = json.loads((tmp_path / "policies" / "result-none.json").read_text())
    command = result["server"]["command"]
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(want)
    assert result["workload"]["split"] == "tune"
