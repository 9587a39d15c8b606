"""benchmarks/gpu/detached.sh on the CPU: a job started in a session of its own outlives the command that
started it, runs in a copy of the tree it was started from, `wait` returns its exit status once it ends, and
`status` tells a running job from one that was killed. The script runs on the lent GPU, where a broken one
costs device time."""

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _detached(tmp_path, *args, pythonpath=""):
    """detached.sh run from a small working tree, tmp_path/tree, as the device runs it from the repo root"""
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    env = {**os.environ, "DETACHED": str(tmp_path / "jobs"), "PYTHONPATH": pythonpath}
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/detached.sh"), *args], cwd=tree, env=env, capture_output=True,
        text=True, timeout=300,
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


def test_the_job_runs_in_a_copy_of_the_tree_that_outlives_the_tree(tmp_path):
    """A later device command re-copies the tree a job was started from; the job must not read from it."""
    tree, go = tmp_path / "tree", tmp_path / "go"
    tree.mkdir()
    (tree / "data.txt").write_text("the traces")
    (tree / ".git").mkdir()
    (tree / ".git" / "big").write_text("not copied")
    job = f'while [ ! -f {go} ]; do sleep 0.1; done; cat data.txt; ls -a; echo "path=$PYTHONPATH"'
    started = _detached(tmp_path, "start", "t", "bash", "-c", job, pythonpath=f"/site:{tree}")
    assert started.returncode == 0, started.stderr
    (tree / "data.txt").unlink()  # as the next command's copy of the tree does
    go.touch()
    waited = _detached(tmp_path, "wait", "t", "240")
    assert "t ended with status 0" in waited.stdout, waited.stdout + waited.stderr
    log = (tmp_path / "jobs" / "t.log").read_text()
    copy = tmp_path / "jobs" / "t.tree"
    assert "the traces" in log and ".git" not in log.split()
    assert f"path=/site:{copy}" in log
