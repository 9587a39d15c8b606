"""A real TP=2 server on the CPU (gloo): every socket its processes listen on is on loopback, and its
workers die with rank 0 however rank 0 ends (SIGKILL included, even a worker that cannot read its pipe)."""

from __future__ import annotations

import os
import signal

import pytest

from flashstate.distributed.group import bind_host, interface_of
from tests.processes import alive, children, cmdline, kill_all, listening, wait_gone

EXIT_BOUND_S = 60.0  # a generous bound on a loaded machine, not a timing claim

SERVE = ["--served-model-name", "m", "--tensor-parallel-size", "2", "--kv-cache-memory-bytes", "32M"]
SERVE += ["--prefill-cost-coefficients", "1e-5", "1e-8"]


def _tp_server(tmp_path):
    from tests.server.conftest import Server  # the server's dependencies (the GPU machine has none)

    server = Server(SERVE, tmp_path / "log")
    server.wait_ready()
    status, body = server.post_json(
        "/v1/completions", {"model": "m", "prompt": [5, 6, 7, 8, 9], "max_tokens": 3, "temperature": 0}
    )
    assert status == 200 and body["usage"]["completion_tokens"] == 3, body
    return server


def _workers(server) -> list[int]:
    """The rank-1 worker (multiprocessing's resource tracker is a child too, started with `-c`)."""
    found = [p for p in children(server.proc.pid) if "--multiprocessing-fork" in cmdline(p)]
    assert found, f"no worker process under {server.proc.pid}:\n{server.log_tail()}"
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/net"), reason="reads /proc (Linux)")
def test_every_listening_socket_of_rank_0_and_its_workers_is_on_loopback(tmp_path):
    server = _tp_server(tmp_path)
    try:
        workers = _workers(server)
        sockets = {pid: listening(pid) for pid in [server.proc.pid, *workers]}
    finally:
        server.stop()
    assert ("127.0.0.1", server.port) in sockets[server.proc.pid], sockets  # the HTTP server
    # rank 0: HTTP, the rendezvous store, its gloo device; a worker: its gloo device
    assert len(sockets[server.proc.pid]) >= 3 and all(sockets[w] for w in workers), sockets
    wide = {pid: [s for s in socks if s[0] != "127.0.0.1"] for pid, socks in sockets.items()}
    assert not any(wide.values()), f"listening beyond loopback: {wide}"


def test_the_bind_host_is_the_servers_host_and_loopback_for_a_wildcard():
    assert bind_host(None) == bind_host("") == bind_host("0.0.0.0") == bind_host("::") == "127.0.0.1"
    assert bind_host("127.0.0.1") == "127.0.0.1" and bind_host("[::1]") == "::1"
    assert bind_host("10.1.2.3") == "10.1.2.3"
    assert interface_of("127.0.0.1") in ("lo", None) and interface_of("192.0.2.254") is None


def test_sigkill_of_rank_0_kills_a_worker_that_cannot_read_its_pipe(tmp_path):
    """A stopped worker never sees its pipe close: only the kernel's parent-death signal ends it."""
    server = _tp_server(tmp_path)
    workers = _workers(server)
    try:
        for w in workers:
            os.kill(w, signal.SIGSTOP)
        server.proc.kill()
        server.proc.wait(timeout=EXIT_BOUND_S)
        left = wait_gone(workers, EXIT_BOUND_S)
        assert not left, f"workers {left} outlived rank 0"
    finally:
        kill_all([w for w in workers if alive(w)])
        server.stop()
