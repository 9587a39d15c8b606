"""benchmarks/gpu/detached.sh on the CPU: a job started in a session of its own outlives the command that
started it, `wait` returns its exit status once it ends, and `status` tells a running job from one that was
killed. The script runs on the lent GPU, where a broken one costs device time."""

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _detached(tmp_path, *args):
    env = {**os.environ, "DETACHED": str(tmp_path / "jobs")}
    return subprocess.run(
        ["bash", "benchmarks/gpu/detached.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_a_detached_job_runs_on_and_reports_how_it_ended(tmp_path):
    marker = tmp_path / "marker"
    started = _detached(tmp_path, "start", "j", "bash", "-c", f"echo hello; touch {marker}; exit 4")
    assert started.returncode == 0, started.stderr
    waited = _detached(tmp_path, "wait", "j", "240")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "j ended with status 4" in waited.stdout and "hello" in waited.stdout
    assert marker.exists() and (tmp_path / "jobs" / "j.rc").read_text().strip() == "4"
    assert _detached(tmp_path, "start", "j").returncode == 2  # no command


def test_status_tells_a_running_job_from_a_killed_one(tmp_path):
    assert _detached(tmp_path, "start", "s", "sleep", "600").returncode == 0
    status = _detached(tmp_path, "status", "s")
    assert status.returncode == 3 and "s running" in status.stdout
    again = _detached(tmp_path, "start", "s", "sleep", "1")
    assert again.returncode == 2 and "already running" in again.stderr
    pid = int((tmp_path / "jobs" / "s.pid").read_text())
    os.killpg(pid, signal.SIGKILL)  # the job leads its own session and process group
    waited = _detached(tmp_path, "wait", "s", "240")
    assert waited.returncode == 1 and "left no status" in waited.stderr
    assert _detached(tmp_path, "status", "never").returncode == 1
