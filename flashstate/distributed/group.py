"""The collective group of the tensor-parallel ranks (gloo on CPU, NCCL on GPU), built from a TCP store
without touching torch.distributed's global default group, so engines can come and go in one process.

Every socket the ranks listen on is bound to one host address (`bind_host`: the server's --host, loopback
for a wildcard or by default), never to all interfaces: the store listens on a socket bound here and handed
over by descriptor (TCPStore itself would listen on `*`), gloo's device is created for that address rather
than for whatever the machine's hostname resolves to, and NCCL's bootstrap is kept on its interface.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from flashstate.engine.worker.decode_inputs import DecodeInputs
from flashstate.models.shard_plan import reduce_points

# A step longer than this (a huge prefill on CPU) would be a bug: the collectives give up.
STEP_TIMEOUT = datetime.timedelta(hours=1)
TEARDOWN_SECONDS = 60.0  # NCCL's communicator teardown; past it the engine closes without waiting

logger = logging.getLogger("flashstate")


def disable_nvls() -> None:
    """NCCL's NVLink multicast (NVLS) stays off on these machines: set before any NCCL communicator."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"


LOOPBACK = "127.0.0.1"
_WILDCARDS = ("", "*", "0.0.0.0", "::", "[::]")


def bind_host(host: str | None) -> str:
    """The address the ranks' sockets bind: `host` (the server's --host), loopback when it is unset or a
    wildcard (the ranks share one machine: nothing beyond it needs to reach them)."""
    host = (host or "").strip()
    return LOOPBACK if host in _WILDCARDS else host.strip("[]")


def _listening_socket(host: str) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def master_store(world_size: int, host: str = LOOPBACK) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free port of `host` (`.port`)."""
    sock = _listening_socket(host)
    port = sock.getsockname()[1]
    try:
        store = dist.TCPStore(
            host,
            port,
            world_size,
            True,
            timeout=STEP_TIMEOUT,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now
    return store


def client_store(port: int, world_size: int, host: str = LOOPBACK) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, False, timeout=STEP_TIMEOUT)


def gloo_options(host: str) -> dist.ProcessGroupGloo._Options:
    """A gloo group whose one device listens on `host` (by default gloo binds the address the machine's
    hostname resolves to, or what GLOO_SOCKET_IFNAME names)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = STEP_TIMEOUT
    return opts


def interface_of(host: str) -> str | None:
    """The network interface holding IPv4 address `host` (`lo` for loopback), None if none does."""
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return None
    if addr.is_loopback:
        return "lo" if "lo" in {name for _, name in socket.if_nameindex()} else None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                req = struct.pack("256s", name.encode()[:15])
                if socket.inet_ntoa(fcntl.ioctl(s.fileno(), siocgifaddr, req)[20:24]) == str(addr):
                    return name
    return None


def pin_nccl_interface(host: str) -> None:
    """NCCL's bootstrap and proxy sockets on `host`'s interface (unless NCCL_SOCKET_IFNAME is set): set
    before any NCCL communicator, and inherited by the workers spawned after it."""
    if "NCCL_SOCKET_IFNAME" in os.environ:
        return
    name = interface_of(host)
    if name is None:
        logger.warning("no network interface holds %s: NCCL picks its own (set NCCL_SOCKET_IFNAME)", host)
        return
    os.environ["NCCL_SOCKET_IFNAME"] = name


class TPGroup:
    """`all_reduce` and `broadcast` over all ranks (in place). On CPU a gloo group of its own; on GPU NCCL
    through torch.distributed's default group (so one tensor-parallel engine per process at a time)."""

    def __init__(
        self, store: dist.Store, rank: int, world_size: int, device: torch.device, host: str = LOOPBACK
    ):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.pg = None
        if device.type == "cuda":
            disable_nvls()
            pin_nccl_interface(host)
            if dist.is_initialized():
                raise RuntimeError("torch.distributed is already initialised in this process")
            dist.init_process_group(
                "nccl", store=dist.PrefixStore("nccl/", store), rank=rank, world_size=world_size
            )
        else:
            prefixed = dist.PrefixStore("gloo/", store)
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, gloo_options(host))

    def all_reduce(self, x: Tensor) -> Tensor:
        if self.pg is None:
            dist.all_reduce(x)
        else:
            self.pg.allreduce([x]).wait()
        return x

    def broadcast(self, x: Tensor) -> Tensor:
        """Rank 0's `x` into every rank's `x` (in place; contiguous)."""
        if x.dtype == torch.bool:  # gloo has no bool: the same bytes as uint8
            self.broadcast(x.view(torch.uint8))
            return x
        if self.pg is None:
            dist.broadcast(x, src=0)
        else:
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            self.pg.broadcast([x], opts).wait()
        return x

    def attach(self, model: nn.Module) -> None:
        attach_reduce(model, self.all_reduce)

    def close(self, timeout: float = TEARDOWN_SECONDS) -> None:
        """Destroy the NCCL group (every rank at once: the teardown may wait for its peers). A teardown
        still running after `timeout` is left behind with a warning rather than hanging the caller."""
        if self.pg is not None or not dist.is_initialized():
            return
        teardown = threading.Thread(target=dist.destroy_process_group, name="nccl-teardown", daemon=True)
        teardown.start()
        teardown.join(timeout)
        if teardown.is_alive():
            logger.warning(
                "tensor-parallel rank %d: NCCL teardown unfinished after %.0f s; left running",
                self.rank,
                timeout,
            )


def attach_reduce(model: nn.Module, all_reduce: Callable[[Tensor], Tensor]) -> None:
    """Sum the output of every layer half across ranks (its row-parallel layers emit partial sums)."""
    modules = dict(model.named_modules())
    names = reduce_points(model.spec.architecture, list(modules))
    if not names:
        raise RuntimeError(f"no layer halves to reduce in {model.spec.architecture}")
    for name in names:
        modules[name].register_forward_hook(lambda _m, _args, out: all_reduce(out))


def broadcast_decode_inputs(group: TPGroup, inputs: DecodeInputs, rows: int, tables_changed: bool) -> None:
    """Rank 0's uploaded decode buffers into every rank's (rows [0, rows) of the block tables, when they
    changed): the same bytes a decode forward or graph replay reads on every rank."""
    group.broadcast(inputs.ints)
    group.broadcast(inputs.has_state)
    if tables_changed:
        group.broadcast(inputs.tables[:rows])


def split_cpu_threads(device: torch.device, world_size: int) -> int:
    """On CPU the ranks share the cores: give this process its share of torch's threads (N processes
    each spinning all cores' threads is many times slower). Returns the previous count."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(max(1, before // world_size))
    return before


def rank_device(device: torch.device, rank: int) -> torch.device:
    """One GPU per rank: rank r of an engine on cuda:k runs on cuda:k+r; on CPU every rank is `cpu`."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)
