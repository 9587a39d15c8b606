"""HostArena: one host buffer, page-locked once at start-up, that the memory store's objects are carved from.

A fresh page-locked buffer (cudaHostAlloc) costs about 1 ms per MiB and blocks kernel launches from every
other thread while it runs (benchmarks/gpu/pinned_alloc.py: a step of small launches went from 1.8 to 81
ms on the H200). The memory store keeps every object it is given, so without an arena each write-back
would pay that on the engine's critical path.

    arena = HostArena(nbytes, pin=True)
    buf = arena.allocate(n)    # 1-D uint8 view, or None when no free range is large enough
    del buf                    # the range is free again once no tensor views it any more

Invariants: free ranges are disjoint, sorted by offset and coalesced with their neighbours; a range is
returned to the free list only when the last tensor sharing its memory is gone (a finalizer on the
numpy view every tensor of the range keeps alive), so an object still read by a restore in flight is
never handed out again. Finalizers may run on any thread, even inside `allocate` (garbage collection):
they only queue the range, and the next call under the lock merges it.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time
import weakref

import numpy as np
import torch

logger = logging.getLogger("flashstate.host")
ALIGN = 4096


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class HostArena:
    def __init__(self, nbytes: int, pin: bool = False):
        if nbytes < 1:
            raise ValueError(f"host arena size must be >= 1 byte, got {nbytes}")
        self.nbytes = _align(nbytes)
        self._memory = np.empty(self.nbytes, dtype=np.uint8)
        self._starts = [0]  # free ranges: starts (sorted) and sizes
        self._sizes = [self.nbytes]
        self._released: collections.deque[tuple[int, int]] = collections.deque()
        self._lock = threading.Lock()
        self.pinned = False
        if pin:
            self._pin()

    def _pin(self) -> None:
        start = time.perf_counter()
        torch.from_numpy(self._memory).zero_()  # fault the pages in on every core, not inside the driver call
        rc = torch.cuda.cudart().cudaHostRegister(self._memory.ctypes.data, self.nbytes, 0)
        if int(rc) != 0:
            logger.warning(
                "host arena: cudaHostRegister failed (%s): host copies will not be asynchronous", rc
            )
            return
        self.pinned = True
        logger.info(
            "host arena: %.1f GiB page-locked in %.1f s", self.nbytes / (1 << 30), time.perf_counter() - start
        )

    @property
    def free_bytes(self) -> int:
        with self._lock:
            self._merge_released()
            return sum(self._sizes)

    def allocate(self, nbytes: int) -> torch.Tensor | None:
        size = _align(max(nbytes, 1))
        with self._lock:
            self._merge_released()
            i = next((i for i, s in enumerate(self._sizes) if s >= size), None)
            if i is None:
                return None
            offset = self._starts[i]
            if self._sizes[i] == size:
                del self._starts[i], self._sizes[i]
            else:
                self._starts[i] += size
                self._sizes[i] -= size
        view = self._memory[offset : offset + size]
        weakref.finalize(view, self._released.append, (offset, size))
        return torch.from_numpy(view)[:nbytes]

    def _merge_released(self) -> None:
        while self._released:
            offset, size = self._released.popleft()
            i = bisect.bisect(self._starts, offset)
            if i < len(self._starts) and offset + size == self._starts[i]:  # joins the next range
                size += self._sizes[i]
                del self._starts[i], self._sizes[i]
            if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == offset:  # joins the previous one
                self._sizes[i - 1] += size
            else:
                self._starts.insert(i, offset)
                self._sizes.insert(i, size)

    def close(self) -> None:
        """Unlock the pages (tensors still viewing the arena stay valid, as ordinary host memory)."""
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self._memory.ctypes.data)
            self.pinned = False
