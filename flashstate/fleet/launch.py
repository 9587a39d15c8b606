"""A fleet on one host: an optional Mooncake master, N `flashstate serve` replicas, vllm-router before them.

    running_fleet(spec, out_dir) → Fleet      starts the master (spec.shared: every replica gets
                                              --host-cache mooncake --mooncake-master on it), the replicas
                                              (one free loopback port each, the same serve flags), then the
                                              router, and waits until the router reports every replica
                                              healthy; stops them all (router first) on leaving the block
    Fleet.url                                 the router: what clients and `flashstate bench` talk to
    Fleet.replicas[i].kill() / .start()       a replica SIGKILLed / started again on its port (it rejoins
                                              once the router's health poll sees it answer)
    Fleet.restart_dead()                      starts again every replica that exited on its own
    Fleet.restart_master()                    starts the master again on its address (empty)

Logs: <out_dir>/master.log, replica-<i>.log, router.log. Children die with this process (PR_SET_PDEATHSIG)
and are started from a lasting thread (lifeline.py), as bench compare's servers are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flashstate.bench.compare import ServerError, ServerSpec, free_port, stop_process, wait_ready
from flashstate.cache.host.mooncake import MasterProcess, start_master
from flashstate.fleet.router import router_command
from flashstate.lifeline import spawn_child


@dataclass(frozen=True, slots=True)
class FleetSpec:
    replicas: int = 2
    policy: str = "cache_aware"  # the router's
    shared: bool = False  # one Mooncake master; every replica's host tier on it
    host_cache_bytes: str = "1G"  # each replica's share of the Mooncake pool (spec.shared)
    cache_policy: str = "flashstate"  # the replicas' --cache-policy
    serve_args: tuple[str, ...] = ()  # every replica's, as given
    router_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int | None = None  # the router's; None: a free one
    startup_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"a fleet needs at least 1 replica, got {self.replicas}")
        if self.shared and any(a.startswith(("--host-cache", "--mooncake-master")) for a in self.serve_args):
            raise ValueError("--shared-host-cache sets --host-cache and --mooncake-master: leave them out")


@dataclass(slots=True)
class Replica:
    index: int
    command: list[str]
    port: int
    log: Path
    startup_timeout_s: float
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start the process (on the same port every time); `wait` for it to answer."""
        with open(self.log, "a") as fh:
            self.proc = spawn_child(self.command, fh)

    def wait(self) -> None:
        wait_ready(self.url, self.startup_timeout_s, self.proc, self.log)

    def start(self) -> None:
        self.launch()
        self.wait()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to the replica's process group (SIGKILL: it dies mid-request, nothing cleaned up)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@dataclass(slots=True)
class Fleet:
    url: str
    replicas: list[Replica]
    router: subprocess.Popen
    master: MasterProcess | None = None
    restarts: list[int] = field(default_factory=list)  # replica indices started again, in order

    def restart_master(self, log: Path | None = None) -> None:
        """Start the master again on its address if it has exited (it comes back empty; the replicas
        rejoin it on their own: cache/host/tier.py pings an unreachable store)."""
        if self.master is None or self.master.process.poll() is None:
            return
        host, _, port = self.master.address.rpartition(":")
        self.master = start_master(int(port), host=host, log=None if log is None else str(log))

    def restart_dead(self) -> list[int]:
        """Start again (and wait for) every replica whose process has exited."""
        dead = [r for r in self.replicas if not r.alive]
        for r in dead:
            r.start()
            self.restarts.append(r.index)
        return [r.index for r in dead]


def replica_command(spec: FleetSpec, port: int, master: str | None) -> list[str]:
    extra = [] if master is None else [
        "--host-cache", "mooncake", "--mooncake-master", master, "--host-cache-bytes", spec.host_cache_bytes,
    ]  # fmt: skip
    return ServerSpec(serve_args=spec.serve_args).command(spec.cache_policy, port, tuple(extra))


@contextlib.contextmanager
def running_fleet(spec: FleetSpec, out_dir: Path) -> Iterator[Fleet]:
    out_dir.mkdir(parents=True, exist_ok=True)
    master = replicas = router = None
    try:
        master = start_master(log=str(out_dir / "master.log")) if spec.shared else None
        replicas = []
        for i in range(spec.replicas):
            port = free_port()
            cmd = replica_command(spec, port, master.address if master else None)
            replicas.append(Replica(i, cmd, port, out_dir / f"replica-{i}.log", spec.startup_timeout_s))
        for r in replicas:  # all load at once; then each must answer
            r.launch()
        for r in replicas:
            r.wait()
        port = spec.port or free_port()
        cmd = router_command(
            [r.url for r in replicas], spec.policy, spec.host, port, free_port(), spec.router_args
        )
        with open(out_dir / "router.log", "w") as fh:
            router = spawn_child(cmd, fh)
        url = f"http://{spec.host}:{port}"
        try:
            wait_ready(url, 60.0, router, out_dir / "router.log")  # 200 once every replica is healthy
        except ServerError as e:
            raise ServerError(f"router: {e}") from None
        yield Fleet(url, replicas, router, master)
    finally:
        if router is not None:
            stop_process(router)
        for r in replicas or ():
            r.stop()
        if master is not None:
            master.stop()
