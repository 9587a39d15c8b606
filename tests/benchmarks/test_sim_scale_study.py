"""benchmarks/sim_scale_study.py --plot-only: a study's curves (one plot per metric of the reference's Fig. 6)
and table, redrawn from its scale.json without running anything."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _row(fraction: float, policy: str, tpm: float) -> dict:
    return {
        "agents": 48, "gpus": 1, "fraction": fraction, "budget": int(fraction * 2e10), "policy": policy,
        "hit_rate": 0.9, "uncached_p50": 150.0, "ttft_p50": 0.1, "ttft_p90": 0.3, "requests": 500,
        "output_tpm": tpm, "completed_agents": 12, "cpu_s": 5.0,
    }  # fmt: skip


def test_plot_only_redraws_every_curve_from_the_saved_rows(tmp_path):
    rows = [_row(f, p, 1000 * f) for f in (0.5, 1.0) for p in ("flashstate", "vllm")]
    (tmp_path / "scale.json").write_text(json.dumps({"rows": rows}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/sim_scale_study.py"), "--plot-only", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert pngs == {
        f"{m}.png" for m in ("hit_rate", "uncached_p50", "ttft_p90", "output_tpm", "completed_agents")
    }
    assert "| 48 | 1 | 100% | 20.0 GB | vllm |" in done.stdout


def test_plot_only_refuses_the_flags_of_a_run(tmp_path):
    (tmp_path / "scale.json").write_text(json.dumps({"rows": [_row(0.5, "vllm", 500.0)]}))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/sim_scale_study.py"), "--plot-only", "--out", str(tmp_path),
         "--agents", "96"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "--agents would change nothing" in done.stderr
    assert not list(tmp_path.glob("*.png"))
