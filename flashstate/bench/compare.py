"""`flashstate bench compare`: the same workload against one fresh server per cache policy, one after
another (same model, budget and seed; `--rounds` repeats them in alternating order), then one side-by-side
report.

Each server is `python -m flashstate.cli serve --host 127.0.0.1 --port <free> --cache-policy P <serve
args>`, its log in `<out>/server-<P>.log`; it is stopped (SIGTERM, then SIGKILL) before the next starts.
A server never outlives the bench: on Linux it gets SIGTERM from the kernel when the bench process ends,
however it ends (PR_SET_PDEATHSIG), and a bench stopped by SIGTERM or Ctrl-C stops its server first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from flashstate.bench.cost import Prices
from flashstate.bench.replay import ReplayConfig, replay
from flashstate.bench.report import build_result, write_json
from flashstate.bench.step_summary import summarize_steps
from flashstate.bench.workloads import Session
from flashstate.lifeline import spawn_child


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    serve_args: tuple[str, ...] = ()  # passed to the server as given
    startup_timeout_s: float = 600.0
    python: str = sys.executable
    entry: tuple[str, ...] = ("-m", "flashstate.cli", "serve")  # what runs after `python`

    def command(self, policy: str, port: int, extra: tuple[str, ...] = ()) -> list[str]:
        return [
            self.python,
            *self.entry,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cache-policy",
            policy,
            *self.serve_args,
            *extra,
        ]


@dataclass(frozen=True, slots=True)
class Variant:
    """One server of a comparison: a name for the report, a cache policy and flags of its own."""

    name: str
    policy: str
    serve_args: tuple[str, ...] = ()


def wait_ready(
    base_url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None
) -> None:
    """Poll GET /health until 200; ServerError if the process exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise ServerError(f"server exited with status {proc.returncode} before it was ready:\n{tail}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise ServerError(f"server at {base_url} not ready after {timeout_s:.0f} s")


PORT_ATTEMPTS = 3  # a free port can be taken by another process before the server binds it


@contextlib.contextmanager
def server_process(
    spec: ServerSpec, policy: str, log: Path, extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, list[str]]]:
    """A running server for `policy` (plus `extra` flags): yields (base_url, command); stops it on exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        cmd = spec.command(policy, port, extra)
        with open(log, "w") as fh:
            proc = spawn_child(cmd, fh)
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base_url, spec.startup_timeout_s, proc, log)
            break
        except ServerError:
            stop_process(proc)
            if attempt == PORT_ATTEMPTS or "address already in use" not in log.read_text(errors="replace"):
                raise
        except BaseException:
            stop_process(proc)
            raise
    try:
        yield base_url, cmd
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of a server started with start_new_session, SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def run_compare(
    variants: list[Variant],
    config: ReplayConfig,
    workload: Callable[[], list[Session] | Iterator[Session]],
    workload_info: dict[str, Any],
    scale: dict[str, Any],
    prices: Prices,
    spec: ServerSpec,
    out_dir: Path,
    log: Callable[[str], None] = print,
    rounds: int = 1,
) -> dict[str, dict[str, Any]]:
    """One result per variant, in order; `workload()` must give the same sessions on every call.

    With `rounds` > 1 every variant runs once per round, the order reversed each round (A B, B A, A B, ...)
    so that load from outside falls on all of them alike; a variant's result is its first round's, with
    `rounds` listing every round's summary and cost (report.py takes medians and spreads over them).
    Each variant's first-round result is written to `<out_dir>/result-<name>.json` as soon as it is built,
    so a compare cut short (a server that fails, a machine taken back) keeps the runs it finished; the
    report rewrites it whole at the end."""
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            tag = v.name if rounds == 1 else f"{v.name}-round{r + 1}"
            log(f"== {tag}: starting the server")
            steps = out_dir / f"steps-{tag}.jsonl"
            steps.unlink(missing_ok=True)
            extra = (*v.serve_args, "--step-trace", str(steps))
            with server_process(spec, v.policy, out_dir / f"server-{tag}.log", extra) as (base_url, cmd):
                log(f"== {tag}: replaying on {base_url}")
                run = replay(replace(config, base_url=base_url), workload())
            server = {
                "command": cmd,
                "cache_policy": v.policy,
                "variant_args": list(v.serve_args),
                "steps": summarize_steps(steps),  # the whole server run, warm-up and drain included
            }
            runs[v.name].append(build_result(run, v.name, workload_info, scale, prices, server))
            if r == 0:
                write_json(out_dir / f"result-{v.name}.json", runs[v.name][0])
    results = {}
    for v in variants:
        first = runs[v.name][0]
        if rounds > 1:
            first["rounds"] = [{"summary": x["summary"], "cost": x["cost"]} for x in runs[v.name]]
        results[v.name] = first
    return results
