"""The host store interface, and the embedded in-process store.

A store maps string keys to immutable byte objects (1-D uint8 CPU tensors). It may drop objects on its
own (a missing key is a miss, never an error); `StoreUnavailableError` means the store cannot be reached
at all (the tier then runs without it until `ping` succeeds again); `StoreTimeoutError`, one of those, that
a call did not finish within the store's deadline (a hung or unreachable master).
"""

from __future__ import annotations

import threading
from typing import Protocol

import torch

from flashstate.cache.host.arena import HostArena

ARENA_HEADROOM = 8  # the arena holds capacity * (1 + 1/8)


class StoreUnavailableError(RuntimeError):
    """The store (e.g. the Mooncake master) cannot be reached."""


class StoreTimeoutError(StoreUnavailableError):
    """A store call did not finish within its deadline."""


class HostStore(Protocol):
    name: str
    shared: bool  # other engines write to it too (lookups probe it for their states)

    @property
    def capacity(self) -> int:
        """Bytes the store holds before it refuses or drops objects."""
        ...

    def put(self, key: str, data: torch.Tensor) -> bool:
        """Store `data` (1-D uint8, CPU) under `key`; False if the store refused it (no room)."""
        ...

    def get(self, key: str) -> torch.Tensor | None:
        """The object under `key` (1-D uint8, CPU, read only), or None when the store does not hold it."""
        ...

    def exists(self, key: str) -> bool: ...

    def exists_many(self, keys: list[str]) -> list[bool]: ...

    def remove(self, key: str) -> None: ...

    def ping(self) -> bool:
        """The store is reachable and accepts writes."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """Objects in this process's memory; `capacity` bytes at most (a put beyond it is refused). Objects are
    built in place in an arena (arena.py) page-locked once when CUDA is present, so copies to and from the
    GPU are asynchronous DMA and no write pays for page-locking. The arena has headroom over `capacity`:
    a removed object's range frees only once the tier's writer has dropped it and no restore reads it."""

    name = "memory"
    shared = False

    def __init__(self, capacity: int, pin: bool | None = None):
        if capacity < 1:
            raise ValueError(f"host store capacity must be >= 1 byte, got {capacity}")
        self._capacity = capacity
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.arena = HostArena(capacity + capacity // ARENA_HEADROOM, pin=self.pin)
        self._objects: dict[str, torch.Tensor] = {}
        self._used = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def used(self) -> int:
        return self._used

    def allocate(self, nbytes: int) -> torch.Tensor | None:
        """A buffer to build an object in, which `put` keeps without a copy; None when the arena has no
        free range that large."""
        return self.arena.allocate(nbytes)

    def put(self, key: str, data: torch.Tensor) -> bool:
        with self._lock:
            old = self._objects.get(key)
            used = self._used - (old.numel() if old is not None else 0) + data.numel()
            if used > self._capacity:
                return False
            self._objects[key] = data
            self._used = used
            return True

    def get(self, key: str) -> torch.Tensor | None:
        return self._objects.get(key)

    def exists(self, key: str) -> bool:
        return key in self._objects

    def exists_many(self, keys: list[str]) -> list[bool]:
        return [k in self._objects for k in keys]

    def remove(self, key: str) -> None:
        with self._lock:
            old = self._objects.pop(key, None)
            if old is not None:
                self._used -= old.numel()

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            self._objects.clear()
            self._used = 0
        self.arena.close()
