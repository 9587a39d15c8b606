"""The Mooncake store as a host store (`mooncake-transfer-engine-non-cuda`, TCP transport), and a helper
that runs a real `mooncake_master`.

Each engine is a store client: it mounts `capacity` bytes of its own memory into the store's global
segment pool and reads or writes objects anywhere in the pool through the master (one master per
deployment). An engine started while the master is down serves without the tier and joins when the
master answers (`connect=False`, then `ping`). The master evicts objects on its own when the pool fills
(a missing key is a miss) and leases an object for `--default_kv_lease_ttl` after each read (removals use
`force`).
Return codes (negative on error): -200 no room (the pool is full, or a restarted master does not know
this client's segment yet), -704 not found, -705 already exists, -900 RPC failure (the master is gone),
-901 RPC timeout (the master hangs), ≤ -1000 coordination errors; -900, -901 and ≤ -1000 mean
unavailable, the rest a refused operation.

Deadlines: every client call runs on one of a few worker threads and the caller waits for it at most
`timeout` seconds (the client's own RPC timeout, MC_RPC_TIMEOUT_MS, is set to the same unless the
environment sets it), so no caller ever blocks longer on a hung master: a call past its deadline raises
StoreTimeoutError and is left to finish on its worker. When every worker is still held by such calls, a
new call fails at once instead of queueing behind them.
Listening sockets: the client's listeners bind the address it advertises to its peers (listen.py), which
is loopback when the master is.
Placement: puts prefer this client's own segment (the pool's other segments only when it is full), so an
engine that dies takes mostly its own objects with it, not those the other engines wrote.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import torch

from flashstate.cache.host.listen import listen_only_on
from flashstate.cache.host.store import StoreTimeoutError, StoreUnavailableError

logger = logging.getLogger("flashstate.host")
_NO_ROOM, _NOT_FOUND, _EXISTS, _RPC_FAIL, _RPC_TIMEOUT = -200, -704, -705, -900, -901
# Seconds a caller waits for one store call. A healthy call takes milliseconds, but on a machine with 3x more
# runnable threads than cores a put was seen past 2 s (a false outage empties the index): 5 s.
DEFAULT_TIMEOUT = 5.0
SETUP_TIMEOUT = 30.0  # joining the store: mounting the segment, the transfer engine's listeners
WORKERS = 8  # above the tier's concurrent callers (engine, writer, 4 fetch threads): a full pool is a hang


def _unavailable(rc: int) -> bool:
    return rc in (_RPC_FAIL, _RPC_TIMEOUT) or rc <= -1000


def _import_store() -> tuple[type, type]:
    """The binding's client and put-placement classes."""
    # The client logs through glog to stderr: keep only fatal messages unless the user asked for more.
    os.environ.setdefault("GLOG_minloglevel", "3")
    try:
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    except ImportError as e:
        hint = " (apt-get install -y libibverbs1)" if "ibverbs" in str(e) else ""
        raise RuntimeError(
            f"the mooncake host store needs mooncake-transfer-engine-non-cuda{hint}: {e}"
        ) from e
    return MooncakeDistributedStore, ReplicateConfig


def local_address(master: str) -> str:
    """The address of this host on the route to the master (what other store clients connect to)."""
    host = master.rpartition(":")[0]
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]


class _Workers:
    """Calls on daemon threads, each waited for at most its deadline (see the module docstring)."""

    def __init__(self, n: int, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = 0  # calls submitted and not finished, hung ones included
        self._n = n
        self._lock = threading.Lock()
        for i in range(n):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def call(self, what: str, timeout: float, fn: Callable, *args: Any) -> Any:  # noqa: ANN401
        with self._lock:
            if self._busy >= self._n:
                raise StoreTimeoutError(f"Mooncake {what}: every worker is still waiting on the store")
            self._busy += 1
        future: Future = Future()
        self._jobs.put((future, fn, args))
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise StoreTimeoutError(f"Mooncake {what} took longer than {timeout:g} s") from None

    def _run(self) -> None:
        while True:
            future, fn, args = self._jobs.get()
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 — handed to the caller
                future.set_exception(e)
            finally:
                with self._lock:
                    self._busy -= 1


class MooncakeStore:
    name = "mooncake"
    shared = True

    def __init__(
        self,
        master: str,
        capacity: int,
        local_buffer_bytes: int = 64 << 20,
        connect: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
        listen_host: str | None = None,
    ):
        """Join the store (`connect`: now, raising StoreUnavailableError if the master cannot be reached;
        else at the first `connect` or `ping` that finds it up). `timeout`: seconds any call may take.
        `listen_host`: the address the client's listeners bind (default: the one it advertises)."""
        if timeout <= 0:
            raise ValueError(f"the host cache timeout must be > 0 s, got {timeout}")
        self.master = master
        self.timeout = timeout
        self._capacity = capacity
        self._local_buffer_bytes = local_buffer_bytes
        self._listen_host = listen_host
        self._store_type, self._placement_type = _import_store()
        self._placement = self._placement_type()  # where puts go: this client's segment, once joined
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", str(max(int(timeout * 1000), 1)))
        os.environ.setdefault("MC_RPC_CONNECT_TIMEOUT_MS", str(max(int(timeout * 1000), 1)))
        self._workers = _Workers(WORKERS, "flashstate-mooncake")
        self._client = None
        self._joining: Future | None = None  # a set-up still running (past its deadline, it may yet succeed)
        self._join_lock = threading.Lock()
        self.refusals = 0  # puts refused for want of room (the pool full, or the segment not yet mounted)
        if connect:
            self.connect()

    def _call(self, what: str, fn: Callable, *args: Any, timeout: float | None = None) -> Any:  # noqa: ANN401
        return self._workers.call(what, self.timeout if timeout is None else timeout, fn, *args)

    def connect(self, wait: float | None = None) -> None:
        """Join the store; StoreUnavailableError if it cannot, StoreTimeoutError if joining takes longer
        than `wait` seconds (default SETUP_TIMEOUT; the set-up goes on, and a later connect or ping that finds
        it done uses it)."""
        host, _, port = self.master.rpartition(":")
        try:  # the client's own set-up retries for a minute and more when nothing listens
            socket.create_connection((host, int(port)), timeout=min(2.0, self.timeout)).close()
        except OSError as e:
            raise StoreUnavailableError(f"the Mooncake master at {self.master} does not answer ({e})") from e
        with self._join_lock:
            if self._joining is None or self._joining.done():
                self._joining = Future()
                threading.Thread(target=self._join, args=(self._joining,), daemon=True).start()
            joining = self._joining
        try:
            rc = joining.result(max(SETUP_TIMEOUT, self.timeout) if wait is None else wait)
        except FutureTimeout:
            raise StoreTimeoutError(f"joining the Mooncake store at {self.master} hangs") from None
        if rc != 0:
            raise StoreUnavailableError(f"cannot join the Mooncake store at {self.master} (error {rc})")

    def _join(self, done: Future) -> None:
        """A client set up on a thread of its own: it is kept if it succeeds, even past the caller's wait."""
        try:
            local = local_address(self.master)
            listen_only_on(self._listen_host or local)
            client = self._store_type()
            rc = client.setup(
                local, "P2PHANDSHAKE", self._capacity, self._local_buffer_bytes, "tcp", "", self.master
            )
            if rc == 0:
                placement = self._placement_type()
                placement.preferred_segment = client.get_hostname()  # the segment's name in the pool
                self._placement, self._client = placement, client
            done.set_result(rc)
        except Exception as e:  # noqa: BLE001 — handed to the caller
            done.set_exception(e)

    @property
    def _joined(self) -> Any:  # noqa: ANN401 — the client of the Mooncake binding
        if self._client is None:
            raise StoreUnavailableError(f"not joined to the Mooncake store at {self.master}")
        return self._client

    @property
    def capacity(self) -> int:
        return self._capacity

    def put(self, key: str, data: torch.Tensor) -> bool:
        rc = self._call("put", self._joined.put, key, memoryview(data.numpy()), self._placement)
        if _unavailable(rc):
            raise StoreUnavailableError(f"Mooncake put failed with {rc} (master {self.master})")
        if rc == _NO_ROOM:
            self.refusals += 1
        return rc in (0, _EXISTS)

    def get(self, key: str) -> torch.Tensor | None:
        data = self._call("get", self._joined.get, key)
        if not data:
            self.exists(key)  # tells a missing key from a dead master
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read only: the bytes object is never written
            return torch.frombuffer(data, dtype=torch.uint8)

    def exists(self, key: str) -> bool:
        rc = self._call("lookup", self._joined.is_exist, key)
        if rc < 0 and _unavailable(rc):
            raise StoreUnavailableError(f"Mooncake lookup failed with {rc} (master {self.master})")
        return rc == 1

    def exists_many(self, keys: list[str]) -> list[bool]:
        codes = self._call("lookup", self._joined.batch_is_exist, keys) if keys else []
        # 1: present, 0: absent, < 0: the client could not find out (e.g. its master hung or restarting):
        # an answer of "absent" would hide an outage, so any error code is one
        if any(rc < 0 for rc in codes):
            bad = next(rc for rc in codes if rc < 0)
            raise StoreUnavailableError(f"Mooncake lookup failed with {bad} (master {self.master})")
        return [rc == 1 for rc in codes]

    def remove(self, key: str) -> None:
        rc = self._call("remove", self._joined.remove, key, True)
        if _unavailable(rc):
            raise StoreUnavailableError(f"Mooncake remove failed with {rc} (master {self.master})")

    def ping(self) -> bool:
        """The master answers a write within the deadline (joining the store first if this client never
        did). A write refused for want of room counts: the master is up, the pool full or still
        remounting this client's segment after a restart."""
        if self._client is None:
            try:
                self.connect()
            except StoreUnavailableError:
                return False
        key = f"flashstate/ping/{uuid.uuid4().hex}"
        rc = self._call("ping", self._joined.put, key, b"1")
        if rc == 0:
            self._call("remove", self._joined.remove, key, True)
        return rc in (0, _NO_ROOM)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._call("close", self._client.close)
            except StoreTimeoutError:
                logger.warning("host tier: the Mooncake client did not close within %g s", self.timeout)


# ---- the master --------------------------------------------------------------------------------


def master_binary() -> str:
    """`mooncake_master` from this Python's environment, else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mooncake_master")
    found = here if os.access(here, os.X_OK) else shutil.which("mooncake_master")
    if found is None:
        raise FileNotFoundError(
            "mooncake_master not found: pip install mooncake-transfer-engine-non-cuda "
            "(and apt-get install -y libibverbs1)"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def master_command(
    port: int, metrics_port: int, host: str = "127.0.0.1", lease_ttl_ms: int = 500
) -> list[str]:
    """A master serving RPC on host:port; its metrics/admin server on host:metrics_port. No built-in
    metadata server (it would listen on every interface): clients use P2P handshakes."""
    return [
        master_binary(),
        f"--rpc_address={host}",
        f"--rpc_port={port}",
        f"--metrics_host={host}",
        f"--metrics_port={metrics_port}",
        f"--default_kv_lease_ttl={lease_ttl_ms}",
        "--logtostderr",
    ]


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the thread that started it exits, whatever ended it (Linux
    PR_SET_PDEATHSIG; SIGKILL because a stopped master would keep a SIGTERM pending forever), and exits at
    once if that parent is already gone."""

    def child() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died between fork and prctl
                os._exit(1)

    return child


@dataclass
class MasterProcess:
    process: subprocess.Popen
    address: str  # HOST:PORT for --mooncake-master

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped master would not act on SIGTERM
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_master(
    port: int | None = None,
    metrics_port: int | None = None,
    host: str = "127.0.0.1",
    log: str | None = None,
    timeout: float = 30.0,
    quiet: bool = True,
) -> MasterProcess:
    """Start `mooncake_master` and wait until its RPC port accepts connections. Its log goes to `log`
    (a file), else nowhere when `quiet`, else to this process's stderr."""
    port = port or free_port(host)
    metrics_port = metrics_port or free_port(host)
    if log is not None:
        out = open(log, "ab")  # noqa: SIM115 — the child keeps it open
    else:
        out = subprocess.DEVNULL if quiet else sys.stderr
    proc = subprocess.Popen(
        master_command(port, metrics_port, host),
        stdout=out,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {proc.returncode} (port {port} taken?)")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
        except OSError:
            time.sleep(0.05)
            continue
        time.sleep(0.1)
        if proc.poll() is None:
            return MasterProcess(proc, f"{host}:{port}")
    proc.kill()
    raise RuntimeError(f"mooncake_master did not listen on {host}:{port} within {timeout:.0f} s")
