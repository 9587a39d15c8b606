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


def test_a_point_is_the_median_of_its_noise_seeds(tmp_path, traces):
    """`--noise-seeds K` on a profile with step noise: each point runs at K seeds and reports each figure's
    median, with the seeds' range beside it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "FLASHSTATE_TRACES": str(traces)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/sim_scale_study.py"), "--agents", "4", "--fractions", "0.5",
         "--policies", "vllm", "--profile", "h200-qwen3-next-2b-tune", "--noise-seeds", "3", "--warmup", "5",
         "--duration", "30", "--ramp", "2", "--length-scale", "0.05", "--max-context", "16384",
         "--time-scale", "0.05", "--max-think-time", "2", "--max-output-tokens", "64", "--jobs", "1",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "scale.json").read_text())["rows"]
    assert row["noise_seeds"] == [0, 1, 2]
    for key in ("ttft_p90", "output_tpm"):
        low, high = row["spread"][key]
        assert low <= row[key] <= high
    assert row["spread"]["ttft_p50"][0] < row["spread"]["ttft_p50"][1]  # the seeds ran apart


def test_the_ablation_runs_each_mechanism_alone_on_the_given_serve_flags(tmp_path, traces):
    """asc-only and gds-aligned run flashstate with one of its two cache mechanisms swapped out, a host
    tier only where the variant has one, and --serve-args on every run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "FLASHSTATE_TRACES": str(traces)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/sim_scale_study.py"), "--agents", "4", "--fractions", "0.5",
         "--policies", "asc-only", "gds-aligned", "flashstate-host", "--profile", "h200-qwen3-next-2b-tune",
         "--serve-args=--max-num-seqs 4 --reserve-working-slots", "--host-cache-bytes", "1G", "--warmup", "5",
         "--duration", "30", "--ramp", "2", "--drain", "5", "--length-scale", "0.05", "--max-context",
         "16384", "--time-scale", "0.05", "--max-think-time", "2", "--max-output-tokens", "64", "--jobs", "1",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {r["policy"]: r for r in json.loads((tmp_path / "scale.json").read_text())["rows"]}
    assert set(rows) == {"asc-only", "gds-aligned", "flashstate-host"}
    flags = {policy: " ".join(row["serve_flags"]) for policy, row in rows.items()}
    assert "--prefix-cache-eviction lru" in flags["asc-only"]
    assert "--mamba-checkpoint-placement aligned" in flags["gds-aligned"]
    assert "--host-cache memory --host-cache-bytes 1G" in flags["flashstate-host"]
    assert not any("--host-cache" in flags[p] for p in ("asc-only", "gds-aligned"))
    for row in rows.values():
        assert row["serve_flags"][-1] == "--reserve-working-slots"
        assert row["cache_plan"].startswith("cache: 4 working state slots")
        assert row["requests"] > 0 and row["drain"] == 5
    assert "| gds-aligned |" in done.stdout


def test_serve_args_may_not_overrule_the_budget_or_a_variant(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/sim_scale_study.py"), "--policies", "flashstate",
         "--serve-args=--prefix-cache-eviction lru --kv-cache-memory-bytes=1000", "--out", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--kv-cache-memory-bytes, --prefix-cache-eviction would overrule" in done.stderr
    assert not (tmp_path / "scale.json").exists()
