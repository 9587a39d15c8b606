"""`flashstate mooncake-master` + `flashstate serve --host-cache mooncake`: finished requests are written
to the Mooncake store (host-tier metrics on /metrics), and a master that dies fails no request."""

import random
import signal
import subprocess
import sys
import time

from tests.server.conftest import free_port, running_server


def test_serve_writes_back_to_mooncake_and_survives_the_master(tmp_path):
    port = free_port()
    with open(tmp_path / "master.log", "w") as log:
        master = subprocess.Popen(
            [sys.executable, "-m", "flashstate.cli", "mooncake-master", "--port", str(port),
             "--metrics-port", str(free_port())],
            stdout=subprocess.PIPE, stderr=log, text=True,
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
