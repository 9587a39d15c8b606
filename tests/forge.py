"""What any other client of a shared Mooncake store can do to an engine's host-tier objects: list the keys
(the master's HTTP admin port serves /get_all_keys), read an object, and put another under its key with a
valid checksum (the checksum is no secret). For the fault tests and benchmarks/faults."""

from __future__ import annotations

import urllib.request

import torch

from flashstate.cache.host.codec import check, encode
from flashstate.cache.host.mooncake import MooncakeStore

HOWS = ("layout", "random", "corrupt")


class Forger:
    def __init__(self, master: str, admin_port: int, capacity: int = 64 << 20):
        self.admin = f"http://{master.rpartition(':')[0]}:{admin_port}"
        self.store = MooncakeStore(master, capacity)

    def keys(self, kind: str = "state") -> list[str]:
        """The host-tier keys of `kind` (state or kv) the store holds, every engine's."""
        with urllib.request.urlopen(f"{self.admin}/get_all_keys", timeout=10) as r:
            lines = r.read().decode().splitlines()
        return sorted(k for k in lines if k.startswith("flashstate/") and f"/{kind}/" in k)

    def forge(self, key: str, how: str, seed: int = 0) -> bool:
        """Replace the object under `key`: "layout" (a sound object whose header names other shapes),
        "random" (the right shapes, random values), "corrupt" (one payload bit flipped, checksum stale).
        False when the object is gone or unreadable."""
        buffer = self.store.get(key)
        if buffer is None:
            return False
        specs, _ = check(key, buffer)  # the checksum verifies with or without the engine's secret
        if specs is None:
            return False
        g = torch.Generator().manual_seed(seed)
        if how == "layout":
            data = encode(key, [torch.zeros((s[0] + 1, *s[1:]) if s else (2,), dtype=d) for d, s in specs])
        elif how == "random":
            data = encode(key, [torch.randn(s, generator=g).to(d) for d, s in specs])
        elif how == "corrupt":
            data = buffer.clone()
            data[-1] ^= 1
        else:
            raise ValueError(f"how must be one of {HOWS}, got {how!r}")
        self.store.remove(key)
        return self.store.put(key, data)

    def close(self) -> None:
        self.store.close()
