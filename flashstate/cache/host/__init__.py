"""Host tier (DESIGN.md §2.3): finished requests' hybrid states written back to host memory, restored
on a GPU-cache miss. store.py (the store interface, the embedded store), mooncake.py (the Mooncake store,
deadlines on its calls), listen.py (Mooncake's listeners on one address), codec.py (object format,
checksum, MAC), layout.py (keys), transfer.py (device ↔ object copies), tier.py (index, eviction,
write-back thread, faults, probing a shared store), restore.py (a restore in flight: background fetch,
side-stream copies), build.py (from the engine config)."""

from flashstate.cache.host.build import build_host_tier
from flashstate.cache.host.store import HostStore, MemoryStore, StoreTimeoutError, StoreUnavailableError
from flashstate.cache.host.tier import HostTier

__all__ = [
    "HostStore",
    "HostTier",
    "MemoryStore",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "build_host_tier",
]
