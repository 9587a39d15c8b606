"""What a newcomer meets in the first hour, through the real CLI: every mistake ends with one line, not a
traceback; a busy port is refused before the model loads; `bench run` reaches a server behind a key."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from flashstate.cli import main
from tests.server.conftest import HOST, Server, free_port

FAST = ["--prefill-cost-coefficients", "1e-5", "1e-10", "--device", "cpu"]


def _serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHSTATE_API_KEY", "VLLM_API_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "flashstate.cli", "serve", "--host", HOST, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_version():
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0


def test_a_busy_port_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = _serve("--port", str(port), *FAST)
    assert r.returncode == 1
    assert f"cannot listen on {HOST}:{port}" in r.stderr
    assert "Traceback" not in r.stderr and "serving" not in r.stderr
    assert "tensor parallel" not in r.stderr  # LLMEngine's line after the model is built


def test_a_hugging_face_id_gets_a_download_hint():
    r = _serve("--port", str(free_port()), "Qwen/Qwen3-Next-80B-A3B-Instruct", *FAST[:3])
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "hf download Qwen/Qwen3-Next-80B-A3B-Instruct --local-dir" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line():
    r = _serve("--port", str(free_port()), "--device", "cuda", *FAST[:3])
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "flashstate: error: --device cuda:" in r.stderr


def test_ctrl_c_while_loading_is_one_line(tmp_path):
    log = tmp_path / "server.log"
    server = Server(["--device", "cpu"], log)  # no cost coefficients: it calibrates, which takes a while
    try:
        while "GIL switch interval" not in log.read_text(errors="replace"):  # past the imports
            assert server.proc.poll() is None, server.log_tail()
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGINT)
        server.proc.wait(timeout=60)
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert server.proc.returncode in (0, 130)


def test_bench_run_with_an_api_key(tmp_path):
    server = Server([*FAST], tmp_path / "server.log", api_key="k-123")
    try:
        server.wait_ready()
        out = tmp_path / "bench"
        args = ["--url", server.url, "--out", str(out), "--api-key", "k-123", "--no-progress"]
        args += [
            "--agents",
            "2",
            "--warmup",
            "0",
            "--duration",
            "120",
            "--max-requests",
            "6",
            "--length-scale",
            "0.01",
        ]
        args += ["--time-scale", "0", "--max-output-tokens", "4"]
        assert main(["bench", "run", *args]) == 0
        summary = json.loads((out / "result-run.json").read_text())["summary"]
        assert summary["requests"] > 0 and summary["errors"] == 0
    finally:
        server.stop()
