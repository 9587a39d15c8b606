"""A `flashstate bench compare` process that is killed (SIGKILL) or stopped (SIGTERM) while it replays
leaves no `flashstate serve` behind (real processes: the embedded tiny model on the CPU)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flashstate.lifeline import preexec_die_with_parent
from tests.processes import alive, children, cmdline, kill_all, wait_gone

START_BOUND_S = 300.0  # generous bounds on a loaded machine, not timing claims
EXIT_BOUND_S = 60.0

SERVE = "--device cpu --max-num-seqs 4 --max-model-len 8192 --prefill-cost-coefficients 1e-5 1e-8"
# Long enough that the replay is still running when the bench is stopped.
WORKLOAD = "--agents 1 --warmup 0 --duration 3600 --max-requests 1000000 --length-scale 0.01 --time-scale 1 "
WORKLOAD += "--max-output-tokens 4 --no-progress"


def _serving(bench: subprocess.Popen, log: Path) -> tuple[int, str]:
    """(pid, url) of the bench's server once it answers /health."""
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        if bench.poll() is not None:
            raise AssertionError(f"the bench exited with {bench.returncode}:\n{log.read_text()[-4000:]}")
        for pid in children(bench.pid):
            args = cmdline(pid)
            if "serve" in args and "--port" in args:
                url = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        return pid, url
                except httpx.HTTPError:
                    pass
        time.sleep(0.25)
    raise AssertionError("the bench's server never answered")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_stopped_bench_leaves_no_server_running(tmp_path, sig):
    cmd = [sys.executable, "-m", "flashstate.cli", "bench", "compare", "--policies", "flashstate"]
    cmd += ["--serve-args", SERVE, "--out", str(tmp_path / "out"), *WORKLOAD.split()]
    with open(tmp_path / "bench.log", "wb") as log:
        # The test's own child dies with the test too, should the test process be killed.
        bench = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec_die_with_parent()
        )
    server = None
    try:
        server, url = _serving(bench, tmp_path / "bench.log")
        assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 200
        bench.send_signal(sig)
        rc = bench.wait(timeout=EXIT_BOUND_S)
        assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM)
        left = wait_gone([server], EXIT_BOUND_S)
        assert not left, f"server {server} outlived the bench ({sig.name})"
    finally:
        bench.kill()
        bench.wait()
        if server is not None and alive(server):
            kill_all([server])
    text = (tmp_path / "bench.log").read_text(errors="replace")
    if sig == signal.SIGTERM:
        assert "stopped by SIGTERM" in text, text[-3000:]
