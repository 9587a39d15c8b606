"""A real `flashstate serve` process on a free loopback port, for the server tests.

Each test module starts its own server (module-scoped fixture) and the fixture always kills it at teardown;
on Linux the server also dies with the test process (PR_SET_PDEATHSIG), so an interrupted run leaves none.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

HOST = "127.0.0.1"
START_TIMEOUT_S = 120


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    def __init__(
        self, args: list[str], log: Path, api_key: str | None = None, module: str = "flashstate.cli"
    ):
        """`module`: what `python -m` runs, with flashstate.cli's arguments (tests/server/fault_server.py
        injects faults)."""
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.api_key = api_key
        self.log = log
        cmd = [
            sys.executable,
            "-m",
            module,
            "serve",
            "--host",
            HOST,
            "--port",
            str(self.port),
            *args,
        ]
        if api_key is not None:
            cmd += ["--api-key", api_key]
        env = {k: v for k, v in os.environ.items() if k not in ("FLASHSTATE_API_KEY", "VLLM_API_KEY")}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if self.request("GET", "/health")[0] == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    # ---- clients --------------------------------------------------------------------------------

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0, **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0, **kw
        )

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One raw HTTP request (any bytes as the body); returns (status, body)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post_json(self, path: str, body: bytes | dict, auth: bool = True) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if auth and self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        status, raw = self.request("POST", path, data, headers)
        return status, json.loads(raw)

    def metrics(self) -> dict[str, float]:
        """Sample name (e.g. `vllm:prompt_tokens_total`, labelled ones as `name{k=v,...}`) → value."""
        status, raw = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(raw.decode()):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def wait_metrics(self, predicate, timeout: float = 20.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if predicate(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"metrics never matched: {m}")
            time.sleep(0.05)


@contextlib.contextmanager
def running_server(
    tmp_path: Path, args: list[str], api_key: str | None = None, module: str = "flashstate.cli"
) -> Iterator[Server]:
    server = Server(args, tmp_path / "server.log", api_key, module)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_servers(tmp_path: Path, args: dict[str, list[str]]) -> Iterator[dict[str, Server]]:
    """A server per name (its log in tmp_path/name/), all started before any is waited for: their
    start-ups overlap."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, a in args.items():
            (tmp_path / name).mkdir(exist_ok=True)
            servers[name] = Server(a, tmp_path / name / "server.log")
            stack.callback(servers[name].stop)
        for server in servers.values():
            server.wait_ready()
        yield servers


def assert_error(status: int, body: dict, want_status: int, code: str | None = None) -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    assert status == want_status, body
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("server_error" if want_status >= 500 else "invalid_request_error")
    if code is not None:
        assert err["code"] == code, err
    return err


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
