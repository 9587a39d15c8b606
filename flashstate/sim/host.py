"""SimHostTier: the host tier in the simulator. The real index (Greedy-Dual-Size over whole states, chunks
shared between states) and the real layout decide what the store holds and what a prompt can restore; the
bytes are counted, not copied, and time comes from measured rates.

    write_back(tokens, depth, …)     at a request's end: the state (and the chunks the store lacks) is
                                     admitted to the index, restorable once its modelled write has landed
    lookup(tokens, limit, floor)     the deepest restorable state on the prompt's path, deeper than floor
    prefetch(hit, first)             a queued request's read-ahead (cache/host/prefetch.py): the inline
                                     read's time, on the fetch thread, plus a GIL switch interval per object
    start_restore(hit, first, …)     a SimRestore, ready after the fetched bytes at the restore rate, plus
                                     a fixed cost per object fetched; taking a read-ahead over, at once

The engine thread's own time inside the tier's calls is charged too, to the step that follows them (the
real tier runs them on the engine thread between steps): a lookup hashes and walks the prompt's chunks, a
restore (start_restore and load in the real tier) reads and verifies its objects when the fetch is inline
and copies them into the blocks (only the copy, `load`, where read ahead), a write-back stages the state's
device → host copies.

Rates: the H200's measured host tier (docs/history/benchmarks-2026-11.md, "Host tier, session 4"): a 1,248 MiB
state read, verified and copied to the device in 0.372 s (3.5 GB/s end to end); its background write-back in
0.635 s (2.06 GB/s). The write-back's device → host copies run beside the steps and are not charged to them.
Per object, a served fetch waits about one GIL switch interval (1 ms) to take the GIL back after the object's
checksum, beside a busy engine thread (docs/history/benchmarks-2026-11.md, "A fetch waits out the GIL's switch
interval once per object": 94 objects in 89.5 ms on the CPU).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
from flashstate.cache.cost import PrefillCost
from flashstate.cache.host.build import chunk_tokens
from flashstate.cache.host.index import HostHit, HostIndex
from flashstate.cache.host.layout import HostLayout
from flashstate.cache.host.prefetch import MAX_PREFETCHES, ReadAhead
from flashstate.cache.host.restore import RestorePhase
from flashstate.sim.profile import MEASURED_2B_HOST_CALLS, HostCallCosts
from flashstate.spec.model_spec import ModelSpec

RESTORE_BYTES_PER_S = 3.5e9
RESTORE_SECONDS_PER_OBJECT = 1e-3
WRITE_BYTES_PER_S = 2.06e9


@dataclass(eq=False, slots=True)
class SimPrefetch(ReadAhead):
    """A read-ahead in flight: its objects read at `ready_at` on the simulation clock."""

    ready_at: float
    release: Callable[[HostHit], None]

    def drop(self) -> None:
        self.release(self.hit)


def _done() -> Future:
    future: Future = Future()
    future.set_result(None)
    return future


@dataclass(eq=False, slots=True)
class SimRestore:
    """A restore in flight: ready at `ready_at` on the simulation clock (never fails: the store is local)."""

    hit: HostHit
    first_chunk: int
    kv_depth: int
    ready_at: float
    clock: Callable[[], float]
    unpin: Callable[[], None]  # the real tier's pin: the state is not evicted while it is read
    # done: `wait_any` returns at once, as nothing is waited for in simulated time
    future: Future = field(default_factory=_done)
    inline: bool = False  # ready at admission: the sequence joins the admitting step
    fetched_at: float | None = None  # when its bytes landed (ready_at), for the request's trace line

    @property
    def depth(self) -> int:
        return self.hit.depth

    def ready(self) -> bool:
        return self.clock() >= self.ready_at

    def poll(self) -> RestorePhase:
        if self.clock() < self.ready_at:
            return RestorePhase.PENDING
        self.unpin()
        return RestorePhase.READY

    def cancel(self) -> None:
        self.unpin()


class SimHostTier:
    def __init__(
        self,
        spec: ModelSpec,
        dtype: torch.dtype,
        block_size: int,
        capacity: int,
        cost: PrefillCost,
        clock: Callable[[], float],
        chunk: int,
        inline_fetch: bool = False,
        kv_cache_dtype: torch.dtype | None = None,
        calls: HostCallCosts = MEASURED_2B_HOST_CALLS,  # the engine thread's time per call
        prefetch: bool = False,
    ):
        self.calls = calls
        self.inline_fetch = inline_fetch  # ready at admission (the fetch's engine-thread time is not charged)
        self.reads_ahead = prefetch and inline_fetch  # queued requests' hits read ahead, as the real tier's
        self.prefetches = self.prefetches_used = self.prefetches_held = 0
        self.layout = HostLayout("simulated", chunk_tokens(block_size, chunk))
        self.token_bytes = kv_bytes_per_block(spec, 1, kv_cache_dtype or dtype)  # the engine's KV bytes
        self.state_bytes = state_bytes_per_slot(spec, dtype)
        self.chunk_bytes = self.layout.chunk_tokens * self.token_bytes
        self.index = HostIndex(capacity, lambda depth: cost.saved(depth, 0), lambda key: None)
        self.clock = clock
        self.restores_started = 0  # an admission that then finds no room cancels its restore
        # the engine thread's time in the calls, by call as the real tier's stats count it (the read-aheads'
        # own starts are not priced)
        self.engine_seconds_by_call: dict[str, float] = defaultdict(float)
        self._engine_pending = 0.0  # of which not yet charged to a step
        self._writes: list[tuple[float, int, str, list[str]]] = []  # (lands at, order, state, its chunks)
        self._order = 0

    def _land_writes(self) -> None:
        now = self.clock()
        while self._writes and self._writes[0][0] <= now:
            _, _, key, chunks = heapq.heappop(self._writes)
            self.index.mark_written(key, chunks)

    def write_back(
        self,
        tokens: list[int],
        depth: int,
        blocks: list[int],
        slot: int,
        chain: list[bytes] | None = None,
        salt: str | None = None,
    ) -> None:
        if depth < 1:
            return
        self._land_writes()
        last, key, chunk_keys = self.layout.keys(tokens, depth, chain, salt)
        if self.index.touch(key):
            return
        new = [k for k in chunk_keys if k not in self.index.chunks]
        # the state object holds the linear states and the KV of the tokens past the last whole chunk
        tail = depth - len(chunk_keys) * self.layout.chunk_tokens
        state_bytes = self.state_bytes + tail * self.token_bytes
        if not self.index.admit(key, depth, last, chunk_keys, state_bytes, self.chunk_bytes):
            return
        self._charge(self.calls.write_back_s, "write_back")
        lands = self.clock() + (state_bytes + len(new) * self.chunk_bytes) / WRITE_BYTES_PER_S
        self._order += 1
        heapq.heappush(self._writes, (lands, self._order, key, new))

    def lookup(
        self,
        tokens: list[int],
        limit: int,
        floor: int = 0,
        chain: list[bytes] | None = None,
        salt: str | None = None,
        peek: bool = False,  # the real tier's: not counted (this one counts no lookups)
    ) -> HostHit | None:
        self._land_writes()
        if not len(self.index):
            return None
        self._charge(limit * self.calls.lookup_s_per_token, "lookup")
        hit = self.index.find(tokens, limit, self.layout.chain(tokens, limit, chain, salt), self.layout)
        return hit if hit is not None and hit.depth > floor else None

    def _read_seconds(self, hit: HostHit, first_chunk: int) -> float:
        """A background fetch of `hit` from chunk `first_chunk` on: its bytes at the restore rate, and a GIL
        switch interval per object (the chunks not shared from the GPU, then the state)."""
        fetched = (hit.depth - first_chunk * self.layout.chunk_tokens) * self.token_bytes + self.state_bytes
        return fetched / RESTORE_BYTES_PER_S + self._objects(hit, first_chunk) * RESTORE_SECONDS_PER_OBJECT

    def _read_ahead_seconds(self, hit: HostHit, first_chunk: int) -> float:
        """A read-ahead of `hit` from the in-process store on a fetch thread beside the busy engine thread:
        the profile's rate per token read (on the card, the same at 1024- and 4096-token chunks)."""
        return self._tokens_read(hit, first_chunk) * self.calls.read_ahead_s_per_token

    def _tokens_read(self, hit: HostHit, first_chunk: int) -> int:
        return hit.depth - first_chunk * self.layout.chunk_tokens

    @staticmethod
    def _objects(hit: HostHit, first_chunk: int) -> int:
        return len(hit.chunks) - first_chunk + 1  # the chunks not shared from the GPU, then the state

    def prefetch(self, hit: HostHit, first_chunk: int) -> SimPrefetch | None:
        """The real tier's read-ahead: `hit` read in the background from now on, its state pinned."""
        if not self.reads_ahead or self.prefetches_held >= MAX_PREFETCHES:
            return None
        self.prefetches_held += 1
        self.prefetches += 1
        self.index.pin(hit.key, 1)
        ready = self.clock() + self._read_ahead_seconds(hit, first_chunk)
        return SimPrefetch(hit, first_chunk, ready, self._prefetch_dropped)

    def _prefetch_dropped(self, hit: HostHit) -> None:
        self.prefetches_held -= 1
        self.index.pin(hit.key, -1)

    def start_restore(
        self,
        hit: HostHit,
        first_chunk: int,
        kv_depth: int,
        blocks: list[int],
        slot: int,
        prefetched: SimPrefetch | None = None,
    ) -> SimRestore:
        self.index.touch(hit.key)  # a hit re-stamps the state, as the real tier's load does
        self.restores_started += 1
        now = ready = self.clock()
        unpin = lambda: self.index.pin(hit.key, -1)  # noqa: E731
        if prefetched is not None and prefetched.covers(hit, first_chunk):
            # the engine thread waits for what is left of the read, then copies the objects in; the sequence
            # runs in the step that admits it (the wait is that step's to carry, so the read counts as landed
            # at admission where it had not)
            self.prefetches_held -= 1
            self.prefetches_used += 1
            # what is left of the read goes at the inline rate while the engine thread waits for it
            read = self._read_ahead_seconds(hit, prefetched.first_chunk)
            left = min(max(0.0, prefetched.ready_at - now) / read, 1.0) if read > 0 else 0.0
            waited = left * self._tokens_read(hit, prefetched.first_chunk) * self.calls.read_s_per_token
            self._charge(waited, "start_restore")
            self._charge(hit.depth * self.calls.load_s_per_token, "load")
            return SimRestore(
                hit,
                first_chunk,
                kv_depth,
                now,
                self.clock,
                unpin,
                inline=True,
                fetched_at=min(prefetched.ready_at, now),
            )
        if prefetched is not None:
            prefetched.drop()
        # an inline restore: the read and verify (start_restore), then the copy in (load)
        self._charge(hit.depth * self.calls.read_s_per_token, "start_restore")
        self._charge(hit.depth * min(self.calls.load_s_per_token, self.calls.restore_s_per_token), "load")
        if not self.inline_fetch:
            ready += self._read_seconds(hit, first_chunk)
        self.index.pin(hit.key, 1)
        return SimRestore(
            hit, first_chunk, kv_depth, ready, self.clock, unpin, inline=self.inline_fetch, fetched_at=ready
        )

    @property
    def engine_seconds(self) -> float:
        """The engine thread's time in the calls, in all."""
        return sum(self.engine_seconds_by_call.values())

    def _charge(self, seconds: float, call: str) -> None:
        self.engine_seconds_by_call[call] += seconds
        self._engine_pending += seconds

    def take_engine_seconds(self) -> float:
        """The engine thread's seconds in the tier's calls since the last take: the next step's to carry."""
        seconds, self._engine_pending = self._engine_pending, 0.0
        return seconds
