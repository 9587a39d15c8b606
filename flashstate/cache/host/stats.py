"""The host tier's counters (`/metrics`: flashstate:host_cache_*), and the engine thread's time inside the
tier's calls (the step trace's `host_ms`)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class HostTierStats:
    states_written: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    writes_skipped: int = 0  # write-backs dropped: no room, refused by the store, tier unavailable
    writes_refused: int = 0  # of those: worth less than what they would evict (GDS), or larger than the tier
    writes_without_buffer: int = 0  # of those: admitted, but the store had no free range for the objects
    lookups: int = 0
    remote_hits: int = 0  # lookups answered by a state another engine wrote (found in a shared store)
    remote_restores: int = 0  # of restores: states another engine wrote (cross-replica restores)
    remote_restored_tokens: int = 0  # of restored_tokens: those of remote_restores
    restores: int = 0
    prefetches: int = 0  # host hits read ahead while their requests waited (prefetch.py)
    prefetches_used: int = 0  # of those: taken over by the request's restore
    restored_tokens: int = 0
    shared_tokens: int = 0  # of restored_tokens: KV the GPU cache still held (shared, not copied)
    misses_dropped: int = 0  # the store no longer held an object
    misses_corrupt: int = 0  # checksum, header or key mismatch
    misses_forged: int = 0  # a secret is set and the object's MAC does not verify
    misses_layout: int = 0  # a sound object whose tensors are not the layout this engine expects
    store_refusals: int = 0  # write-backs the store refused a put of (no room, e.g. the pool full)
    evictions: int = 0
    timeouts: int = 0  # store calls past their deadline (a hung or unreachable store)
    outages: int = 0
    reconnects: int = 0
    # the engine thread's wall time inside lookup, start_restore, load and write_back, per call
    engine_seconds_by_call: dict[str, float] = field(default_factory=dict)

    @property
    def engine_seconds(self) -> float:
        return sum(self.engine_seconds_by_call.values())


def engine_call(method):
    """A HostTier method the engine thread calls: its wall time counts into `stats.engine_seconds`."""
    name = method.__name__

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            by_call = self.stats.engine_seconds_by_call
            by_call[name] = by_call.get(name, 0.0) + time.perf_counter() - start

    return timed
