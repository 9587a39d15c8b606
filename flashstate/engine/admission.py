"""Memory admission (the `flashstate` policy's scheduler): keep the running set inside memory under overload.

The running set's *footprint* is the KV blocks its sequences would hold at their expected lengths (and,
where the cache charges working slots to its budget, each one's slot in blocks' worth of bytes):

    expected_len(s) = max(num_prompt_tokens + min(max_tokens, expected_output_tokens), len(token_ids) + 1)

capped at max_model_len. A waiting sequence is admitted only when the footprint with it stays within the
running share of the cache, (1 − cache_reserve) × the blocks the cache could give, so the running set
grows into what it was admitted for without preempting, and the reserve stays for cached units (the
resume points of the sessions not running). A *cold* sequence (hit depth < half its prompt) that is not
aged must leave the larger `cold_reserve`: its whole footprint is new blocks, taken from the cached units
of sessions that will come back, while a mostly-cached one runs mostly on its own prefix. The hit depth is the
GPU tree's or the host tier's, whichever is deeper: a session restored from the host takes new blocks too,
but it is one of the sessions the reserve is kept for, coming back, and prefills only its tail. Under
overload this keeps the sessions that are cycling cached (a cold first turn waits for the running set to
shrink, or until it is aged); with memory to spare nothing waits for it. When nothing runs the candidate
is admitted whatever its size (the scheduler's liveness rule).

Order of the waiting queue (`order`): a sequence that has waited `max_wait_seconds` or more is *aged*;
aged ones go first, in queue order, and an aged one that does not fit is never passed over (admission
stops until the running set drains enough). Among the others, those whose prompt is mostly cached (hit
depth ≥ half the prompt: a short prefill that frees its place fast) go before the rest, then queue order;
a non-aged one that does not fit is passed over. So every sequence waits at most `max_wait_seconds` plus
the time the running set takes to make room for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashstate.cache.manager import CacheManager
from flashstate.sequence import Sequence


@dataclass(frozen=True, slots=True)
class MemoryAdmission:
    expected_output_tokens: int
    cache_reserve: float  # fraction of the cache the running set leaves to cached units
    max_wait_seconds: float
    max_model_len: int
    cold_reserve: float = 0.0  # the reserve a cold, non-aged sequence must leave (at least cache_reserve)

    def expected_len(self, seq: Sequence) -> int:
        out = seq.params.max_tokens
        out = self.expected_output_tokens if out is None else min(out, self.expected_output_tokens)
        return min(max(seq.num_prompt_tokens + out, len(seq.token_ids) + 1), self.max_model_len)

    def footprint(self, cache: CacheManager, seq: Sequence) -> int:
        """KV blocks `seq` holds at its expected length, and the blocks' worth its working slot is charged."""
        return cache.block_pool.blocks_for(self.expected_len(seq)) + cache.slot_blocks

    def limit(self, cache: CacheManager, cold: bool = False) -> int:
        """Blocks the running set may grow into (admitting a cold sequence: leaving `cold_reserve`)."""
        reserve = max(self.cache_reserve, self.cold_reserve) if cold else self.cache_reserve
        return int(cache.kv_capacity_blocks * (1.0 - (reserve if cache.enabled else 0.0)))

    def limit_for(self, cache: CacheManager, seq: Sequence, now: float, hit: dict[int, int]) -> int:
        """`limit` for admitting the waiting `seq` (`hit`: each waiting one's cached depth)."""
        return self.limit(cache, cold=not self.aged(seq, now) and not self.cached(seq, hit))

    def aged(self, seq: Sequence, now: float) -> bool:
        return now - seq.stats.arrival_time >= self.max_wait_seconds

    @staticmethod
    def cached(seq: Sequence, hit: dict[int, int]) -> bool:
        """Mostly cached: a hit depth of at least half the prompt (a short prefill, on its own prefix)."""
        return 2 * hit.get(id(seq), 0) >= seq.num_prompt_tokens

    def order(
        self, waiting: list[Sequence], now: float, hit: dict[int, int], by_priority: bool
    ) -> list[Sequence]:
        """`waiting` (in queue order) in the order admission tries it; `hit`: each one's cached depth."""

        def key(item: tuple[int, Sequence]) -> tuple:
            i, seq = item
            aged = self.aged(seq, now)
            prio = seq.priority if by_priority else 0
            return (not aged, prio, aged or not self.cached(seq, hit), i)

        return [seq for _, seq in sorted(enumerate(waiting), key=key)]
