"""`flashstate fleet` as a user runs it: it prints the router's URL once every part answers, serves
through it, and a SIGTERM stops the router, the replicas and the master (their ports close)."""

import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from flashstate.fleet.router import router_executable
from tests.server.conftest import _die_with_parent, free_port

try:
    router_executable()
except FileNotFoundError as e:
    pytest.skip(str(e), allow_module_level=True)


def _open(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def test_fleet_command_serves_through_the_router_and_stops_on_sigterm(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "flashstate.cli", "fleet", "--replicas", "1", "--shared-host-cache",
           "--host-cache-bytes", "32M", "--port", str(port), "--out", str(tmp_path), "--",
           "--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "2048"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    try:
        line = proc.stdout.readline()
        m = re.match(r"fleet: router (\S+) \(cache_aware\) → (\S+); mooncake master (\S+);", line)
        assert m and m.group(1) == f"http://127.0.0.1:{port}", line
        router, replica, master = m.group(1), m.group(2), f"http://{m.group(3)}"
        models = httpx.get(f"{router}/v1/models", timeout=30).json()
        assert models["data"][0]["id"] == "flashstate-tiny"
        body = {"model": "flashstate-tiny", "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
        assert httpx.post(f"{router}/v1/completions", json=body, timeout=120).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not any(_open(u) for u in (router, replica, master))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
