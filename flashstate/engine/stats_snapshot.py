"""EngineStats: what /metrics reports of the engine, copied once per step into a frozen value.

The engine thread builds it at the end of every step and swaps it in with one attribute store; the HTTP
thread reads that attribute and nothing else of the engine's live objects, so a scrape never sees a count
mid-update nor walks the scheduler's queues or the cache while the step loop changes them. The host tier's
counters are the exception: its writer thread finishes write-backs after the last step of an idle engine, so
a scrape copies them (`host_snapshot`) rather than read a step's stale copy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashstate.cache.host.stats import HostTierStats
from flashstate.cache.stats import CacheStats

if TYPE_CHECKING:
    from flashstate.cache.host.tier import HostTier
    from flashstate.cache.manager import CacheManager
    from flashstate.engine.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    stats: HostTierStats
    available: bool
    used_bytes: int
    num_states: int


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int = 0
    waiting: int = 0
    restoring: int = 0
    oldest_wait_seconds: float = 0.0  # how long the longest-waiting queued request has waited (at the step)
    preemptions_recompute: int = 0  # cumulative, by kind (Scheduler.stats)
    preemptions_checkpoint: int = 0
    admission_blocked: int = 0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    state_slots_total: int = 0
    state_slots_free: int = 0
    cache: CacheStats = dataclasses.field(default_factory=CacheStats)
    # the prefill cost model in use: (source kind, a, b) of C(n) = a·n + b·n²; None without prefix caching
    cost: tuple[str, float, float] | None = None


def _copy(stats):
    """A copy of a counters dataclass whose dict fields are copied too (the rest are numbers)."""
    return dataclasses.replace(
        stats,
        **{
            f.name: type(v)(v)
            for f in dataclasses.fields(stats)
            if isinstance(v := getattr(stats, f.name), dict)
        },
    )


def host_snapshot(host: HostTier) -> HostSnapshot:
    return HostSnapshot(_copy(host.stats), bool(host.available), host.used, host.num_states)


def snapshot(scheduler: Scheduler, cache: CacheManager) -> EngineStats:
    blocks, slots = cache.block_pool, cache.state_pool
    policy = cache.policy
    now = cache.clock()
    oldest = min((seq.stats.arrival_time for seq in scheduler.waiting), default=now)
    sched = scheduler.stats
    return EngineStats(
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        restoring=len(scheduler.restoring),
        oldest_wait_seconds=max(now - oldest, 0.0),
        preemptions_recompute=sched.preemptions_recompute,
        preemptions_checkpoint=sched.preemptions_checkpoint,
        admission_blocked=sched.admission_blocked,
        kv_blocks_total=blocks.num_blocks,
        kv_blocks_free=blocks.num_free,
        state_slots_total=slots.num_slots,
        state_slots_free=slots.num_free,
        cache=_copy(cache.stats),
        cost=None if policy is None else (policy.cost.kind, policy.cost.a, policy.cost.b),
    )
