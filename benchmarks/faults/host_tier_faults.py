"""Host-tier faults against real processes: one mooncake_master, two `flashstate serve --host-cache mooncake`
engines sharing it (agents alternate turns between them, so every other turn restores from the store what
the other engine wrote), and a reference engine without the tier for the correct greedy outputs. Each
scenario starts a fresh master and engines, runs warm-up turns, injects its fault, runs turns during it,
lifts it where it can be lifted, and runs turns after it.

    PYTHONPATH=. .venv/bin/python benchmarks/faults/host_tier_faults.py \\
        --out benchmarks/faults/RESULTS-host-tier.md

Faults: the master SIGKILLed (not restarted); SIGSTOPped (a hung host or a partition, then SIGCONT);
restarted with empty memory; a full pool (--host-cache-bytes 16M and a neighbour that keeps the pool full
of its own objects); and another client of the store replacing the engines' state objects: one bit
flipped (corrupt), random values of the right shapes with a valid CRC, a header naming another tensor
layout, each without and with a deployment secret (--host-cache-secret-file). Reported per scenario:
requests failed, requests whose greedy output differs from the reference engine's, the longest request
(seconds; the warm-up's longest for comparison) and the engines' fault counters from /metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import http.client
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from prometheus_client.parser import text_string_to_metric_families

from flashstate.cache.host.mooncake import MooncakeStore, free_port, start_master
from tests.forge import Forger

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 600  # a stalled request is measured, not cut short
COUNTERS = {
    "outages": "flashstate:host_cache_outages_total",
    "timeouts": "flashstate:host_cache_timeouts_total",
    "restores": "flashstate:host_cache_restores_total",
    "refused": "flashstate:host_cache_store_refusals_total",
    "corrupt": "flashstate:host_cache_misses_total{reason=corrupt}",
    "forged": "flashstate:host_cache_misses_total{reason=forged}",
    "layout": "flashstate:host_cache_misses_total{reason=layout}",
    "dropped": "flashstate:host_cache_misses_total{reason=dropped}",
}


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Server:
    def __init__(self, name: str, args: list[str], logdir: Path):
        self.name, self.port = name, free_port()
        self.log = logdir / f"{name}.log"
        cmd = [sys.executable, "-m", "flashstate.cli", "serve", "--host", HOST, "--port", str(self.port),
               "--prefill-cost-coefficients", "1e-5", "1e-9", *args]  # fmt: skip
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                if self.request("GET", "/health")[0] == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")

    def complete(self, prompt: list[int], max_tokens: int) -> list[int] | None:
        body = {"model": "flashstate-tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0, "return_token_ids": True}  # fmt: skip
        try:
            status, raw = self.request("POST", "/v1/completions", body)
        except OSError:
            return None
        return json.loads(raw)["choices"][0]["token_ids"] if status == 200 else None

    def metrics(self) -> dict[str, float]:
        with contextlib.suppress(OSError):
            status, raw = self.request("GET", "/metrics")
            out = {}
            for family in text_string_to_metric_families(raw.decode()):
                for s in family.samples:
                    labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
                    out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
            return out
        return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    wrong: int = 0


class Agents:
    """Agent-like sessions: each turn a context grows by the reply and a new user message."""

    def __init__(self, n: int, seed: int):
        self.rng = random.Random(seed)
        self.contexts = [self._tokens(150, 350) for _ in range(n)]

    def _tokens(self, lo: int, hi: int) -> list[int]:
        return [self.rng.randrange(2000) for _ in range(self.rng.randint(lo, hi))]

    def turn(self, engine: Server, reference: Server, phase: Phase, max_tokens: int, check: bool) -> None:
        """One turn of every agent on `engine`, concurrently; a failed request keeps its context."""
        prompts = [c + self._tokens(20, 60) for c in self.contexts]

        def one(prompt: list[int]) -> tuple[list[int] | None, float]:
            start = time.monotonic()
            out = engine.complete(prompt, max_tokens)
            return out, time.monotonic() - start

        with ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(one, prompts))
        for i, (prompt, (out, seconds)) in enumerate(zip(prompts, results, strict=True)):
            phase.latencies.append(seconds)
            if out is None:
                phase.failed += 1
                continue
            if check and reference.complete(prompt, max_tokens) != out:
                phase.wrong += 1
            self.contexts[i] = prompt + out


@dataclass
class Scenario:
    name: str
    fault: str  # kill | stop | restart | full | corrupt | random | layout | none
    secret: bool = False


SCENARIOS = [
    Scenario("no fault", "none"),
    Scenario("master SIGKILL", "kill"),
    Scenario("master SIGSTOP, then SIGCONT", "stop"),
    Scenario("master restarted, empty", "restart"),
    Scenario("pool full (16M + a neighbour)", "full"),
    Scenario("corrupt object (bit flip)", "corrupt"),
    Scenario("forged: random values, valid CRC", "random"),
    Scenario("forged: random values, secret", "random", secret=True),
    Scenario("forged: wrong-layout header", "layout"),
    Scenario("forged: wrong-layout header, secret", "layout", secret=True),
]


def _filler(address: str, stop: threading.Event, counts: dict) -> None:
    """A neighbour that keeps the shared pool full: 1 MiB objects of its own, put back to back (the master
    evicts the least recently used objects, the engines' among them, to make room)."""
    store = MooncakeStore(address, 16 << 20)
    data = torch.zeros(1 << 20, dtype=torch.uint8)
    try:
        while not stop.is_set():
            counts["puts"] += 1
            counts["refused"] += not store.put(f"neighbour/{counts['puts']}", data)
    finally:
        store.close()


def run_scenario(sc: Scenario, reference: Server, logdir: Path, args: argparse.Namespace) -> dict:
    admin = free_port()
    master = start_master(metrics_port=admin, log=str(logdir / f"master-{sc.fault}.log"))
    port = int(master.address.rpartition(":")[2])
    tier = ["--host-cache", "mooncake", "--mooncake-master", master.address, "--host-chunk-tokens", "256",
            "--host-cache-timeout", str(args.timeout),
            "--host-cache-bytes", "16M" if sc.fault == "full" else "64M"]  # fmt: skip
    env_secret = None
    if sc.secret:
        env_secret = logdir / "secret"
        env_secret.write_text("the deployment secret of this benchmark\n")
        tier += ["--host-cache-secret-file", str(env_secret)]
    tag = f"{sc.fault}{'-secret' if sc.secret else ''}"
    engines = [Server(f"{tag}-{'ab'[i]}", tier, logdir) for i in range(2)]
    forger = None
    stop_filler = threading.Event()
    filler = None
    neighbour = {"puts": 0, "refused": 0}
    check = sc.fault in ("none", "corrupt", "random", "layout")
    phases = {"warm": Phase(), "during": Phase(), "after": Phase()}
    agents = Agents(args.agents, seed=1)
    try:
        for e in engines:
            e.wait_ready()
        turn = 0

        def run(phase: str, turns: int) -> None:
            nonlocal turn
            for _ in range(turns):
                agents.turn(engines[turn % 2], reference, phases[phase], args.max_tokens, check)
                turn += 1

        run("warm", 2)
        time.sleep(0.5)  # the last write-backs reach the store
        if sc.fault == "kill":
            master.process.kill()
        elif sc.fault == "stop":
            os.kill(master.process.pid, signal.SIGSTOP)
        elif sc.fault == "restart":
            master.process.kill()
            master.process.wait()
            master = start_master(port=port, metrics_port=admin, log=str(logdir / "master-restart2.log"))
        elif sc.fault == "full":
            filler = threading.Thread(
                target=_filler, args=(master.address, stop_filler, neighbour), daemon=True
            )
            filler.start()
            time.sleep(2)
        elif sc.fault in ("corrupt", "random", "layout"):
            forger = Forger(master.address, admin)
            for i, key in enumerate(forger.keys("state")):
                forger.forge(key, sc.fault, seed=i)
        run("during", args.turns)
        if sc.fault == "stop":
            os.kill(master.process.pid, signal.SIGCONT)
            time.sleep(args.timeout + 2)  # the background probe finds it again
        stop_filler.set()
        run("after", 2)
        counters = {k: sum(e.metrics().get(name, 0) for e in engines) for k, name in COUNTERS.items()}
        available = [e.metrics().get("flashstate:host_cache_available") for e in engines]
    finally:
        stop_filler.set()
        for e in engines:
            e.stop()
        if forger is not None:
            forger.close()
        if sc.fault == "stop":
            with contextlib.suppress(ProcessLookupError):
                os.kill(master.process.pid, signal.SIGCONT)
        master.stop()
    after_fault = phases["during"].latencies + phases["after"].latencies
    name = sc.name
    if sc.fault == "full":
        name += f" (the neighbour's puts: {neighbour['puts']}, refused {neighbour['refused']})"
    return {
        "scenario": name,
        "requests": sum(len(p.latencies) for p in phases.values()),
        "failed": sum(p.failed for p in phases.values()),
        "wrong": sum(p.wrong for p in phases.values()) if check else None,
        "warm_max_s": max(phases["warm"].latencies),
        "max_s": max(after_fault),
        "available_after": available,
        **counters,
    }


def table(rows: list[dict]) -> str:
    head = (
        "| scenario | requests | failed | wrong output | longest (s), warm-up | longest (s), fault on/after "
        "| outages | timeouts | store refused | misses corrupt/forged/layout/dropped | restores |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        wrong = "-" if r["wrong"] is None else str(r["wrong"])
        misses = f"{r['corrupt']:.0f}/{r['forged']:.0f}/{r['layout']:.0f}/{r['dropped']:.0f}"
        lines.append(
            f"| {r['scenario']} | {r['requests']} | {r['failed']} | {wrong} | {r['warm_max_s']:.2f} | "
            f"{r['max_s']:.2f} | {r['outages']:.0f} | {r['timeouts']:.0f} | {r['refused']:.0f} | {misses} | "
            f"{r['restores']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--turns", type=int, default=2, help="turns while the fault is on")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--timeout", type=float, default=2.0, help="--host-cache-timeout of the engines")
    p.add_argument("--only", nargs="*", help="scenario faults to run (default: all)")
    p.add_argument("--out", help="write the results (markdown) here")
    args = p.parse_args()
    started, load_before = time.monotonic(), os.getloadavg()[0]
    logdir = Path(tempfile.mkdtemp(prefix="flashstate-faults-"))
    reference = Server("reference", [], logdir)  # no host tier: the correct greedy outputs
    rows = []
    try:
        reference.wait_ready()
        for sc in SCENARIOS:
            if args.only and sc.fault not in args.only:
                continue
            t0 = time.monotonic()
            rows.append(run_scenario(sc, reference, logdir, args))
            print(f"{sc.name}: {json.dumps(rows[-1])} ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        reference.stop()
    minutes = (time.monotonic() - started) / 60
    result = table(rows)
    command = "PYTHONPATH=. .venv/bin/python benchmarks/faults/host_tier_faults.py " + " ".join(sys.argv[1:])
    if args.out:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU"
        load = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        Path(args.out).write_text(_report(command, machine, result, minutes, args, load))
    print(f"\nlogs: {logdir}; {minutes:.1f} min\n")
    print(result)


def _report(
    command: str, machine: str, result: str, minutes: float, args: argparse.Namespace, load: str
) -> str:
    return f"""# Host tier under faults

Date: {datetime.date(2026, 12, 2).isoformat()}. Machine: this 2-core CPU box ({machine}; `{_cpu_model()}`),
the embedded `tiny` model, {args.agents} agents, {args.turns} turns during each fault, --host-cache-timeout
{args.timeout:g} s. Total run: {minutes:.1f} min; load average {load}.

```bash
{command}
```

Two engines share one master (agents alternate turns between them, so every other turn restores what the
other engine wrote); a third engine without the tier gives the reference outputs ("wrong output" compares
each reply of the scenarios that touch objects; "-": not compared). "longest" is the slowest request of
the warm-up turns, and of the turns while the fault is on and after it is lifted. Counters are the two
engines' /metrics summed at the end.

{result}
"""


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


if __name__ == "__main__":
    main()
