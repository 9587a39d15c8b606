"""The Mooncake store as a host store (`mooncake-transfer-engine-non-cuda`, TCP transport), and a helper
that runs a real `mooncake_master`.

Each engine is a store client: it mounts `capacity` bytes of its own memory into the store's global
segment pool and reads or writes objects anywhere in the pool through the master (one master per
deployment). An engine started while the master is down serves without the tier and joins when the
master answers (`connect=False`, then `ping`). The master evicts objects on its own when the pool fills
(a missing key is a miss) and leases an object for `--default_kv_lease_ttl` after each read (removals use
`force`).
Return codes (negative on error): -704 not found, -705 already exists, -900 RPC failure (the master is
gone), ≤ -1000 coordination errors; the last two mean unavailable, the rest a refused operation.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from flashstate.cache.host.store import StoreUnavailableError

_NOT_FOUND, _EXISTS, _RPC_FAIL = -704, -705, -900


def _unavailable(rc: int) -> bool:
    return rc == _RPC_FAIL or rc <= -1000


def _import_store() -> type:
    # The client logs through glog to stderr: keep only fatal messages unless the user asked for more.
    os.environ.setdefault("GLOG_minloglevel", "3")
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        hint = " (apt-get install -y libibverbs1)" if "ibverbs" in str(e) else ""
        raise RuntimeError(
            f"the mooncake host store needs mooncake-transfer-engine-non-cuda{hint}: {e}"
        ) from e
    return MooncakeDistributedStore


def local_address(master: str) -> str:
    """The address of this host on the route to the master (what other store clients connect to)."""
    host = master.rpartition(":")[0]
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]


class MooncakeStore:
    name = "mooncake"
    shared = True

    def __init__(self, master: str, capacity: int, local_buffer_bytes: int = 64 << 20, connect: bool = True):
        """Join the store (`connect`: now, raising StoreUnavailableError if the master cannot be reached;
        else at the first `connect` or `ping` that finds it up)."""
        self.master = master
        self._capacity = capacity
        self._local_buffer_bytes = local_buffer_bytes
        self._store_type = _import_store()
        self._client = None
        if connect:
            self.connect()

    def connect(self) -> None:
        host, _, port = self.master.rpartition(":")
        try:  # the client's own set-up retries for a minute and more when nothing listens
            socket.create_connection((host, int(port)), timeout=2.0).close()
        except OSError as e:
            raise StoreUnavailableError(f"the Mooncake master at {self.master} does not answer ({e})") from e
        client = self._store_type()
        rc = client.setup(
            local_address(self.master), "P2PHANDSHAKE", self._capacity, self._local_buffer_bytes, "tcp", "",
            self.master,
        )  # fmt: skip
        if rc != 0:
            raise StoreUnavailableError(f"cannot join the Mooncake store at {self.master} (error {rc})")
        self._client = client

    @property
    def _joined(self) -> Any:  # noqa: ANN401 — the client of the Mooncake binding
        if self._client is None:
            raise StoreUnavailableError(f"not joined to the Mooncake store at {self.master}")
        return self._client

    @property
    def capacity(self) -> int:
        return self._capacity

    def put(self, key: str, data: torch.Tensor) -> bool:
        rc = self._joined.put(key, memoryview(data.numpy()))
        if _unavailable(rc):
            raise StoreUnavailableError(f"Mooncake put failed with {rc} (master {self.master})")
        return rc in (0, _EXISTS)

    def get(self, key: str) -> torch.Tensor | None:
        data = self._joined.get(key)
        if not data:
            self.exists(key)  # tells a missing key from a dead master
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read only: the bytes object is never written
            return torch.frombuffer(data, dtype=torch.uint8)

    def exists(self, key: str) -> bool:
        rc = self._joined.is_exist(key)
        if rc < 0 and _unavailable(rc):
            raise StoreUnavailableError(f"Mooncake lookup failed with {rc} (master {self.master})")
        return rc == 1

    def exists_many(self, keys: list[str]) -> list[bool]:
        codes = self._joined.batch_is_exist(keys) if keys else []
        if any(rc < 0 and _unavailable(rc) for rc in codes):
            raise StoreUnavailableError(f"Mooncake lookup failed (master {self.master})")
        return [rc == 1 for rc in codes]

    def remove(self, key: str) -> None:
        rc = self._joined.remove(key, True)
        if _unavailable(rc):
            raise StoreUnavailableError(f"Mooncake remove failed with {rc} (master {self.master})")

    def ping(self) -> bool:
        """A probe object can be written (the master is up and knows this client's segment again)."""
        if self._client is None:
            try:
                self.connect()
            except StoreUnavailableError:
                return False
        key = f"flashstate/ping/{uuid.uuid4().hex}"
        rc = self._client.put(key, b"1")
        if rc == 0:
            self._client.remove(key, True)
        return rc == 0

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


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


def _die_with_parent() -> None:
    """The master gets SIGTERM when the process that started it dies (Linux), so none is left behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class MasterProcess:
    process: subprocess.Popen
    address: str  # HOST:PORT for --mooncake-master

    def stop(self) -> None:
        if self.process.poll() is None:
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
        preexec_fn=_die_with_parent,
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
