"""`flashstate mooncake-master` + `flashstate serve --host-cache mooncake`: finished requests are written
to the Mooncake store (host-tier metrics on /metrics), a master that dies or hangs (SIGSTOP) fails and
stalls no request, objects forged under the engine's keys are misses, and every socket the server
listens on is on loopback."""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.forge import Forger
from tests.procnet import is_loopback, listening
from tests.server.conftest import _die_with_parent, free_port, running_server


def test_serve_writes_back_to_mooncake_and_survives_the_master(tmp_path):
    port = free_port()
    with open(tmp_path / "master.log", "w") as log:
        master = subprocess.Popen(
            [sys.executable, "-m", "flashstate.cli", "mooncake-master", "--port", str(port),
             "--metrics-port", str(free_port())],
            stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
    try:
        line = master.stdout.readline()
        assert line.startswith(f"mooncake_master on 127.0.0.1:{port}"), line
        args = ["--host-cache", "mooncake", "--mooncake-master", f"127.0.0.1:{port}", "--host-cache-bytes",
                "64M", "--prefill-cost-coefficients", "1e-5", "1e-9"]  # fmt: skip
        with running_server(tmp_path, args) as server:
            rng = random.Random(0)
            prompt = [rng.randrange(2000) for _ in range(300)]
            body = {"model": "flashstate-tiny", "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
            status, out = server.post_json("/v1/completions", body)
            assert status == 200, out
            m = server.wait_metrics(lambda m: m.get("flashstate:host_cache_states_written_total", 0) >= 1)
            assert m["flashstate:host_cache_available"] == 1 and m["flashstate:host_cache_used_bytes"] > 0
            skipped = m["flashstate:host_cache_writes_skipped_total"]
            assert m["flashstate:host_cache_writes_refused_total"] <= skipped
            assert m["flashstate:host_cache_writes_without_buffer_total"] <= skipped
            assert m["flashstate:host_cache_engine_seconds_total{call=write_back}"] > 0  # staged it

            master.send_signal(signal.SIGTERM)
            assert master.wait(20) == 0
            time.sleep(0.5)
            for i in range(3):
                body["prompt"] = prompt + [i + 1] * 40
                status, out = server.post_json("/v1/completions", body)
                assert status == 200 and len(out["choices"][0]["text"]) >= 0, out
            m = server.wait_metrics(lambda m: m.get("flashstate:host_cache_outages_total", 0) == 1)
            assert m["flashstate:host_cache_available"] == 0
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()


# ---- faults: a frozen master, objects forged under the engine's keys, listeners ------------------------

TIMEOUT_S = 2.0  # --host-cache-timeout of these servers
HANG_S = 30.0  # what one store call blocked for before deadlines (the client's own RPC timeout)


def _tier_args(master: str, *extra: str) -> list[str]:
    return ["--host-cache", "mooncake", "--mooncake-master", master, "--host-cache-bytes", "64M",
            "--prefill-cost-coefficients", "1e-5", "1e-9", "--host-cache-timeout", str(TIMEOUT_S),
            *extra]  # fmt: skip


def _complete(server, prompt: list[int], max_tokens: int = 6) -> tuple[list[int], float]:
    """Greedy completion of `prompt`: (its token ids, seconds it took)."""
    body = {"model": "flashstate-tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "return_token_ids": True}  # fmt: skip
    start = time.monotonic()
    status, out = server.post_json("/v1/completions", body)
    assert status == 200, out
    return out["choices"][0]["token_ids"], time.monotonic() - start


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in os.listdir(f"/proc/{p}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return out


@pytest.fixture
def master(tmp_path):
    from flashstate.cache.host.mooncake import start_master

    admin = free_port()
    m = start_master(metrics_port=admin, log=str(tmp_path / "master.log"))
    m.admin_port = admin
    yield m
    m.stop()


def test_a_frozen_master_stalls_no_request_and_the_tier_comes_back(tmp_path, master):
    rng = random.Random(1)
    contexts = [[rng.randrange(2000) for _ in range(rng.randint(150, 300))] for _ in range(3)]
    with running_server(tmp_path, _tier_args(master.address)) as server:
        for i, c in enumerate(contexts):
            contexts[i] = c + _complete(server, c)[0]
        server.wait_metrics(lambda m: m.get("flashstate:host_cache_states_written_total", 0) >= 3)
        # every socket the server listens on (HTTP, the Mooncake client's handshake and transfer listeners)
        sockets = [s for pid in _descendants(server.proc.pid) for s in listening(pid)]
        assert len(sockets) >= 3 and all(is_loopback(a) for a, _ in sockets), sockets

        os.kill(master.process.pid, signal.SIGSTOP)  # a hung host or a partition, as the engine sees it
        try:
            took = []
            for _turn in range(2):
                for i, c in enumerate(contexts):
                    out, seconds = _complete(server, c + [rng.randrange(2000) for _ in range(20)])
                    contexts[i] = c + out
                    took.append(seconds)
                fresh = [rng.randrange(2000) for _ in range(200)]  # a request that never touches the tier
                took.append(_complete(server, fresh)[1])
            # the tier gave up on the store after one deadline: no request waited out a store call
            assert max(took) < HANG_S - 5, took
            m = server.wait_metrics(lambda m: m.get("flashstate:host_cache_outages_total", 0) >= 1)
            assert m["flashstate:host_cache_available"] == 0
            assert m["flashstate:host_cache_timeouts_total"] >= 1
        finally:
            os.kill(master.process.pid, signal.SIGCONT)
        m = server.wait_metrics(lambda m: m["flashstate:host_cache_available"] == 1, timeout=90)
        assert m["flashstate:host_cache_reconnects_total"] >= 1
        written = m["flashstate:host_cache_states_written_total"]
        for c in contexts:
            _complete(server, c + [rng.randrange(2000) for _ in range(20)])
        server.wait_metrics(lambda m: m["flashstate:host_cache_states_written_total"] > written)
        assert server.request("GET", "/health")[0] == 200


@pytest.mark.parametrize("how", ["layout", "random"])
def test_a_forged_object_is_a_miss_and_the_output_is_a_clean_runs(tmp_path, master, how):
    """Another client of the store replaces the engine's state objects (a valid checksum): with a header
    naming another tensor layout (no secret needed: a counted miss, the engine lives), or with random values
    of the right shapes under a deployment secret (the MAC rejects it). A fresh engine on the same store
    would restore them; its greedy output must equal the clean run's."""
    secret = tmp_path / "secret"
    secret.write_text("a deployment secret\n")
    args = _tier_args(master.address, *(["--host-cache-secret-file", str(secret)] if how == "random" else []))
    rng = random.Random(2)
    prompt = [rng.randrange(2000) for _ in range(240)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Objects live in the memory of the client that put them: the writer stays up, and so does the forger.
    with running_server(tmp_path / "a", args) as first, contextlib.closing(
        Forger(master.address, master.admin_port)
    ) as forger:
        out = _complete(first, prompt)[0]
        turn2 = prompt + out + [rng.randrange(2000) for _ in range(30)]
        clean = _complete(first, turn2)[0]
        first.wait_metrics(lambda m: m.get("flashstate:host_cache_states_written_total", 0) >= 2)
        keys = forger.keys("state")
        assert keys and all(forger.forge(k, how, seed=i) for i, k in enumerate(keys))
        with running_server(tmp_path / "b", args) as second:  # an empty GPU cache: it probes the store
            assert _complete(second, turn2)[0] == clean
            m = second.metrics()
            reason = "layout" if how == "layout" else "forged"
            assert m[f"flashstate:host_cache_misses_total{{reason={reason}}}"] >= 1, m
            assert m["flashstate:host_cache_restores_total"] == 0
            assert second.request("GET", "/health")[0] == 200 and second.proc.poll() is None
            assert _complete(second, turn2)[0] == clean  # and again, from its own GPU cache now
