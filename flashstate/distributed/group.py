"""The collective group of the tensor-parallel ranks (gloo on CPU, NCCL on GPU), built from a TCP store
without touching torch.distributed's global default group, so engines can come and go in one process."""

from __future__ import annotations

import datetime
import logging
import os
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from flashstate.distributed.shard_plan import reduce_points
from flashstate.engine.decode_inputs import DecodeInputs

# A step longer than this (a huge prefill on CPU) would be a bug: the collectives give up.
STEP_TIMEOUT = datetime.timedelta(hours=1)
TEARDOWN_SECONDS = 60.0  # NCCL's communicator teardown; past it the engine closes without waiting

logger = logging.getLogger("flashstate")


def disable_nvls() -> None:
    """NCCL's NVLink multicast (NVLS) stays off on these machines: set before any NCCL communicator."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"


def master_store(world_size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free loopback port (`.port`)."""
    return dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=STEP_TIMEOUT, wait_for_workers=False)


def client_store(port: int, world_size: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, world_size, False, timeout=STEP_TIMEOUT)


class TPGroup:
    """`all_reduce` and `broadcast` over all ranks (in place). On CPU a gloo group of its own; on GPU NCCL
    through torch.distributed's default group (so one tensor-parallel engine per process at a time)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.pg = None
        if device.type == "cuda":
            disable_nvls()
            if dist.is_initialized():
                raise RuntimeError("torch.distributed is already initialised in this process")
            dist.init_process_group(
                "nccl", store=dist.PrefixStore("nccl/", store), rank=rank, world_size=world_size
            )
        else:
            self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, world_size, STEP_TIMEOUT)

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
