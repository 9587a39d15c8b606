"""HostTier: the index of hybrid states in a host store, GDS eviction of whole states, write-back on a
background thread, restore on a GPU-cache miss, and running without the store while it is unreachable.

    write_back(tokens, depth, blocks, slot)   engine thread, at a request's end: plans the objects the
                                              store lacks, enqueues device → host copies into staging
                                              objects and hands them to the writer thread (checksum,
                                              put); the request never waits for the store
    lookup(tokens, limit, floor) → HostHit    the deepest state the store holds on the prompt's path (a
                                              shared store: also states other engines wrote, by probing)
    start_restore(hit, first_chunk, …)        fetch (below) on the fetch thread; a HostRestore
                                              (restore.py) the engine polls while it keeps stepping
    fetch(hit, first_chunk) → objects | None  reads and verifies the objects from chunk first_chunk on
                                              (a missing, corrupt or forged one, or one whose tensors are
                                              not the layout this engine expects, is a miss: the state
                                              leaves the index); with `staging` (a store whose reads are
                                              pageable memory, on CUDA), copies them into page-locked
                                              staging
    load(hit, objects, blocks, slot, …)       host → device copies into blocks and a state slot (CUDA: on
                                              a side stream; returns the event after them)

Keys (layout.py) take the request's cache salt: `salt` in write_back and lookup; requests of different
salts never find each other's states, salt None gives the unsalted keys.
What the store holds, and which state goes first, is the index's (index.py: Greedy-Dual-Size over whole
states, as on the GPU); the tier holds its lock around every index call.
Faults: StoreUnavailableError from any store call (or from joining the store at start-up: build.py)
marks the tier unavailable (logged once per outage, counted), empties the index (what the store held is
unknown from then on) and makes every call a no-op (a fetch in flight is a miss); the writer thread pings
the store every `retry_seconds` (joining it if it never did) and resumes when it answers. A store with
deadlines (mooncake.py) raises StoreTimeoutError, one of those, when a call outlives its deadline: the
engine thread waits on a hung store for at most one deadline per outage, and not at all during one.
Objects: with `secret`, every object carries a MAC (codec.py) and one whose MAC does not verify is a
miss ("forged"); without, anyone who can write to the store can plant states, so a shared store must
be on a trusted network. Every object's tensors are checked against the layout this engine expects
before anything is copied: a mismatch is a miss, never an exception on the engine thread.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

import torch

from flashstate.cache.cost import PrefillCost
from flashstate.cache.host.arena import HostArena
from flashstate.cache.host.codec import ObjectBuilder, Spec, object_size, verify_many, views
from flashstate.cache.host.index import HostHit, HostIndex
from flashstate.cache.host.layout import HostLayout
from flashstate.cache.host.prefetch import MAX_PREFETCHES, HostPrefetch
from flashstate.cache.host.restore import HostRestore, Landing
from flashstate.cache.host.stats import HostTierStats, engine_call
from flashstate.cache.host.store import HostStore, StoreTimeoutError, StoreUnavailableError
from flashstate.cache.host.transfer import StateTransfer
from flashstate.cache.host.writer import HostWriter

logger = logging.getLogger("flashstate.host")
# background reads (restores fetched off the engine thread, read-aheads) at once; more wait in the queue
FETCH_THREADS = 4
PROBE_CHUNKS = 4  # a shared store is probed for states in this many chunks below the deepest present one


class HostTier:
    def __init__(
        self,
        store: HostStore,
        transfer: StateTransfer,
        layout: HostLayout,
        cost: PrefillCost,
        capacity: int | None = None,
        retry_seconds: float = 1.0,
        pin: bool = False,
        staging: HostArena | None = None,
        inline_fetch: bool = False,
        secret: bytes | None = None,
        prefetch: bool = False,
    ):
        if layout.chunk_tokens % transfer.block_size:
            raise ValueError("the host chunk must be a whole number of KV blocks")
        self.store = store
        self.transfer = transfer
        self.layout = layout
        self.cost = cost
        self._store_allocate = getattr(store, "allocate", None)  # a store that keeps the built buffer
        self.index = HostIndex(
            store.capacity if capacity is None else capacity,
            lambda depth: cost.saved(depth, 0),
            self._left_index,
        )
        self.stats = HostTierStats()
        self.available = True
        self._pin = pin
        self._staging = staging
        self.inline_fetch = inline_fetch  # restores read on the caller's thread (an in-process store)
        self.reads_ahead = prefetch and inline_fetch  # queued requests' hits are read ahead (prefetch.py)
        self._secret = secret or None
        self._chunk_bytes = object_size(layout.chunk_key(layout.root), transfer.kv_specs(layout.chunk_tokens))
        self._lock = threading.RLock()
        self._writer = HostWriter(
            store,
            lambda: self.available,
            self._written,
            self.mark_unavailable,
            self._try_reconnect,
            retry_seconds,
        )
        self._fetcher = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="flashstate-host-fetch")
        self.landing = Landing(self.unpin)
        self._fetches: set[Future] = set()
        self._prefetches_held = 0  # read-aheads pinning a state, not yet taken over or dropped

    @property
    def retry_seconds(self) -> float:
        """How often the writer thread pings an unreachable store."""
        return self._writer.retry_seconds

    @retry_seconds.setter
    def retry_seconds(self, seconds: float) -> None:
        self._writer.retry_seconds = seconds

    @property
    def num_states(self) -> int:
        return len(self.index)

    @property
    def capacity(self) -> int:
        return self.index.capacity

    @property
    def used(self) -> int:
        return self.index.used

    @property
    def block_size(self) -> int:
        return self.transfer.block_size

    # ---- write-back (engine thread) -----------------------------------------------------------------

    @engine_call
    def write_back(
        self,
        tokens: list[int],
        depth: int,
        blocks: list[int],
        slot: int,
        chain: list[bytes] | None = None,
        salt: str | None = None,
    ) -> None:
        """Stage the hybrid state of tokens[:depth] (KV in `blocks`, linear states in `slot`). `chain`: the
        hashes of `tokens` so far (HostLayout.chain's `known`); `salt`: the request's cache salt."""
        if depth < 1:
            return
        if not self.available:
            self.stats.writes_skipped += 1
            return
        self.landing.prune()  # restores whose copies have landed no longer pin their states against eviction
        c, b = self.layout.chunk_tokens, self.block_size
        with self._lock:
            last, key, chunk_keys = self.layout.keys(tokens, depth, chain, salt)
            if self.index.touch(key):
                return
            new = [i for i, k in enumerate(chunk_keys) if k not in self.index.chunks]
            base = len(chunk_keys) * c
            state_specs = self.transfer.state_specs(depth - base)
            # Room first (evicting), then buffers: a full store frees its victims' ranges for them.
            evicted = self.index.evictions
            admitted = self.index.admit(
                key, depth, last, chunk_keys, object_size(key, state_specs), self._chunk_bytes
            )
            self.stats.evictions += self.index.evictions - evicted
            if not admitted:
                self.stats.writes_skipped += 1
                self.stats.writes_refused += 1
                return
            try:
                kv = self.transfer.kv_specs(c)
                objects = [ObjectBuilder(chunk_keys[i], kv, self._allocate, self._secret) for i in new]
                objects.append(ObjectBuilder(key, state_specs, self._allocate, self._secret))
            except MemoryError:
                self.index.forget(self.index.states[key])
                self.stats.writes_skipped += 1
                self.stats.writes_without_buffer += 1
                return
        chunk_blocks = [block for i in new for block in blocks[i * c // b : (i + 1) * c // b]]
        chunks = objects[:-1]
        if chunks:
            self.transfer.gather_chunks(chunk_blocks, [o.buffer for o in chunks], chunks[0].layout)
        obj = objects[-1]
        n = self.transfer.num_state_tensors()
        self.transfer.gather_state(slot, obj.tensors[:n])
        self.transfer.gather_kv(blocks[base // b : -(-depth // b)], depth - base, obj.tensors[n:])
        self._writer.write(key, objects, self.transfer.event())

    def _allocate(self, nbytes: int) -> torch.Tensor:
        """A buffer to build an object in: from the store when it keeps the buffer (MemoryStore's arena),
        else a staging buffer the put copies out of (torch's pinned allocator reuses it after)."""
        if self._store_allocate is None:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin)
        buffer = self._store_allocate(nbytes)
        if buffer is None:
            raise MemoryError(f"the {self.store.name} store has no free range of {nbytes} bytes")
        return buffer

    # ---- restore (engine thread) --------------------------------------------------------------------

    @engine_call
    def lookup(
        self,
        tokens: list[int],
        limit: int,
        floor: int = 0,
        chain: list[bytes] | None = None,
        salt: str | None = None,
        peek: bool = False,
    ) -> HostHit | None:
        """The deepest restorable state at a depth in (floor, limit] on the path of `tokens`: from this
        tier's index, else (a shared store) one another engine wrote, found by probing the store. `chain`,
        `salt`: as for write_back. `peek`: a look ahead of a restore (admission's order), not counted."""
        if not self.available:
            return None
        if not peek:
            self.stats.lookups += 1
        hashes = self.layout.chain(tokens, limit, chain, salt)
        hit = self._lookup_index(tokens, limit, hashes) if len(self.index) else None
        if self.store.shared:
            try:
                remote = self._probe(tokens, limit, max(floor, hit.depth if hit else 0), hashes)
            except StoreUnavailableError as e:
                self.mark_unavailable(e)
                return None
            if remote is not None:
                if not peek:
                    self.stats.remote_hits += 1
                return remote
        return hit if hit is not None and hit.depth > floor else None

    def _lookup_index(self, tokens: list[int], limit: int, hashes: list[bytes]) -> HostHit | None:
        with self._lock:
            return self.index.find(tokens, limit, hashes, self.layout)

    def _probe(self, tokens: list[int], limit: int, floor: int, hashes: list[bytes]) -> HostHit | None:
        """The deepest state object in the store at a depth in (floor, limit], whoever wrote it, at any depth
        the prompt reaches. A state at depth p needs the chunk objects 1..floor(p / C): one batched existence
        check over the prompt's chunk keys gives `reach`, the deepest chunk j with chunks 1..j all present,
        and no restorable state lies past chunk `reach`'s end. Then every depth of the PROBE_CHUNKS chunks
        from there down (above `floor`), one batched check per chunk: at most 1 + PROBE_CHUNKS store calls
        and PROBE_CHUNKS · C state keys hashed, whatever the prompt's length."""
        c = self.layout.chunk_tokens
        top = limit // c
        chunk_keys = [self.layout.chunk_key(h) for h in hashes[1 : top + 1]]
        present = self.store.exists_many(chunk_keys) if chunk_keys else []
        reach = next((i for i, found in enumerate(present) if not found), len(present))
        for j in range(reach, max(floor // c, reach - PROBE_CHUNKS + 1) - 1, -1):
            depths = range(min((j + 1) * c - 1, limit), max(j * c, floor + 1) - 1, -1)
            if not depths:
                continue
            keys = [self.layout.state_key(hashes[j], tokens, p) for p in depths]
            found = [(d, k) for d, k, f in zip(depths, keys, self.store.exists_many(keys), strict=True) if f]
            if found:
                return HostHit(found[0][1], found[0][0], chunk_keys[:j], remote=True)
        return None

    @engine_call
    def prefetch(self, hit: HostHit, first_chunk: int) -> HostPrefetch | None:
        """Read and verify `hit` from chunk `first_chunk` on in the background while its request waits
        (prefetch.py); None where the tier does not read ahead (not the in-process store) or
        MAX_PREFETCHES are held already."""
        if not self.reads_ahead or not self.available:
            return None
        with self._lock:
            if self._prefetches_held >= MAX_PREFETCHES:
                return None
            self._prefetches_held += 1
            self.index.pin(hit.key, 1)
        prefetch = HostPrefetch(hit, first_chunk, Future(), self._prefetch_dropped)
        prefetch.future = future = self._fetcher.submit(self._read_ahead, prefetch)
        self._fetches.add(future)
        future.add_done_callback(self._fetches.discard)
        self.stats.prefetches += 1
        return prefetch

    def _prefetch_dropped(self, hit: HostHit) -> None:
        """A read-ahead no restore took over is done: its state's pin goes (any thread)."""
        with self._lock:
            self._prefetches_held -= 1
            self.index.pin(hit.key, -1)

    def _read_ahead(self, prefetch: HostPrefetch) -> list[list[torch.Tensor]] | None:
        try:
            return self.fetch(prefetch.hit, prefetch.first_chunk)
        except Exception:  # a failed read is a miss at admission, never a failed request
            logger.exception("host tier: read-ahead failed")
            return None
        finally:
            prefetch.fetched_at = time.monotonic()

    @engine_call
    def start_restore(
        self,
        hit: HostHit,
        first_chunk: int,
        kv_depth: int,
        blocks: list[int],
        slot: int,
        prefetched: HostPrefetch | None = None,
    ) -> HostRestore:
        """Fetch `hit` from chunk `first_chunk` on in the background; the restore copies into `blocks`
        (the whole table: ceil(depth / B) blocks) and `slot` once the engine polls it ready. `prefetched`:
        the request's read-ahead, taken over (its objects and its pin) where it covers the restore, else
        dropped."""
        self.landing.prune()
        restore = HostRestore(self, hit, first_chunk, kv_depth, blocks, slot)
        if prefetched is not None and prefetched.covers(hit, first_chunk) and _started(prefetched.future):
            restore.future, restore.prefetch = prefetched.future, prefetched
            restore.skip = first_chunk - prefetched.first_chunk
            # A read still running is waited for: the engine thread, waiting, leaves the fetch thread the
            # interpreter, so the rest of the read takes no longer than reading it inline would, and the
            # sequence runs in the step that admits it (polled instead, it joined a step later).
            wait([prefetched.future])
            restore.inline = True
            with self._lock:
                self._prefetches_held -= 1  # its pin is the restore's now
            self.stats.prefetches_used += 1
            return restore
        if prefetched is not None:  # not covering, or still queued behind other reads: read as without it
            prefetched.drop()
        with self._lock:
            self.index.pin(hit.key, 1)  # its objects' bytes must stay put until the copies have landed
        if self.inline_fetch:
            restore.future, restore.inline = Future(), True
            restore.future.set_result(self._fetch_restore(restore))
            return restore
        # no callback refers back to the restore: a cycle would leave its fetched objects to the collector
        restore.future = future = self._fetcher.submit(self._fetch_restore, restore)
        self._fetches.add(future)
        future.add_done_callback(self._fetches.discard)
        return restore

    def unpin(self, hit: HostHit) -> None:
        """A restore is done reading `hit`'s objects: its state may be evicted again."""
        with self._lock:
            self.index.pin(hit.key, -1)

    def _fetch_restore(self, restore: HostRestore) -> list[list[torch.Tensor]] | None:
        try:
            return self.fetch(restore.hit, restore.first_chunk)
        except Exception:  # a failed fetch is a miss, never a failed request
            logger.exception("host tier: fetch failed")
            return None
        finally:
            restore.fetched_at = time.monotonic()

    def fetch(self, hit: HostHit, first_chunk: int = 0) -> list[list[torch.Tensor]] | None:
        """The objects of `hit` from chunk `first_chunk` on, read and verified (chunks in order, the state
        object last), or None. Checksums run on a thread pool (zlib releases the GIL); views are made here."""
        keys = [*hit.chunks[first_chunk:], hit.key]
        if not self.available:
            return None
        # Read up to the first missing object: the hit is a miss from there, and each read of a lost
        # replica's object can cost a wait.
        buffers = []
        try:
            for key in keys:
                buffers.append(self.store.get(key))
                if buffers[-1] is None:
                    break
        except StoreUnavailableError as e:
            self.mark_unavailable(e)
            return None
        expected = self._expected(hit, len(keys) - 1)
        found = [(k, b, s) for k, b, s in zip(keys, buffers, expected, strict=False) if b is not None]
        checked = dict(zip([k for k, _, _ in found], verify_many(found, self._secret), strict=True))
        objects = []
        for key, buffer in zip(keys, buffers, strict=False):
            specs, reason = checked.get(key, (None, "dropped"))
            if specs is None:
                with self._lock:
                    setattr(self.stats, f"misses_{reason}", getattr(self.stats, f"misses_{reason}") + 1)
                    self.index.forget_object(key)
                if reason != "dropped":  # gone from the store now, not when the writer gets to it: a probe
                    self._remove_now(key)  # of a shared store must not find it in between
                logger.debug("host tier: %s object %s is a miss", reason, key)
                return None
            objects.append(views(key, self._stage(buffer), specs))
        return objects

    def _expected(self, hit: HostHit, num_chunks: int) -> list[list[Spec]]:
        """The tensor specs this engine's caches need in each object of `hit` read from chunk first_chunk on
        (`num_chunks` chunk objects, then the state object)."""
        c = self.layout.chunk_tokens
        kv = self.transfer.kv_specs(c)
        return [kv] * num_chunks + [self.transfer.state_specs(hit.depth - len(hit.chunks) * c)]

    def _stage(self, buffer: torch.Tensor) -> torch.Tensor:
        """`buffer` in page-locked staging memory (fetch thread), when the tier has staging: a host → device
        copy out of pageable memory would block the engine thread until the device has finished the work
        queued before it. A full staging arena leaves the buffer where it is."""
        if self._staging is None:
            return buffer
        staged = self._staging.allocate(buffer.numel())
        if staged is None:
            return buffer
        return staged.copy_(buffer)

    @engine_call
    def load(
        self,
        hit: HostHit,
        objects: list[list[torch.Tensor]],
        blocks: list[int],
        slot: int,
        first_chunk: int = 0,
    ) -> torch.cuda.Event | None:
        """Copy a fetched state (chunks first_chunk.., then the state object) into `blocks` (the whole
        table: ceil(depth / B) blocks; those of chunks < first_chunk already hold their KV) and `slot`.
        On CUDA the copies run on a side stream: the returned event marks when they have landed."""
        c, b = self.layout.chunk_tokens, self.block_size
        with self.transfer.side_stream():
            n = self.transfer.num_state_tensors()
            state = objects[-1]
            self.transfer.scatter_state(slot, state[:n])
            self.transfer.scatter_pieces(blocks[first_chunk * c // b :], [*objects[:-1], state[n:]])
            event = self.transfer.event()
        with self._lock:
            self.index.touch(hit.key)
        self.stats.restores += 1
        self.stats.restored_tokens += hit.depth
        self.stats.shared_tokens += first_chunk * c
        if hit.remote:
            self.stats.remote_restores += 1
            self.stats.remote_restored_tokens += hit.depth
        return event

    def _left_index(self, key: str) -> None:
        """An object left the index (evicted, or unusable): an in-process store drops it at once, so its
        arena range is free for the write-back that evicted it; a remote store's removal is the writer
        thread's, off the engine thread."""
        if self._store_allocate is not None:
            self._remove_now(key)
        else:
            self._writer.remove(key)

    def _remove_now(self, key: str) -> None:
        try:
            self.store.remove(key)
        except StoreUnavailableError as e:
            self.mark_unavailable(e)

    def _written(self, state: str, objects: list[ObjectBuilder], written: list[ObjectBuilder]) -> None:
        """Writer thread, after a write-back's puts: `written` of `objects` reached the store."""
        with self._lock:
            whole = len(written) == len(objects)
            if whole and self.index.mark_written(state, [obj.key for obj in written[:-1]]):
                self.stats.states_written += 1
                self.stats.objects_written += len(written)
                self.stats.bytes_written += sum(o.nbytes for o in written)
            elif self.available:
                self.stats.writes_skipped += 1
                if len(written) < len(objects):
                    self.stats.store_refusals += 1
                for obj in objects:  # a chunk another pending state shares is unusable too
                    if self.index.holds(obj.key):
                        self.index.forget_object(obj.key)
                    else:
                        self._writer.remove(obj.key)

    def mark_unavailable(self, error: Exception) -> None:
        with self._lock:
            if isinstance(error, StoreTimeoutError):
                self.stats.timeouts += 1
            if not self.available:
                return
            self.available = False
            self.stats.outages += 1
            self.index.clear()
        logger.warning(
            "host tier unavailable (%s): serving from the GPU cache alone; retrying every %.0f s",
            error,
            self.retry_seconds,
        )

    def _try_reconnect(self) -> None:
        try:
            ok = self.store.ping()
        except StoreUnavailableError as e:
            ok = False
            if isinstance(e, StoreTimeoutError):
                self.stats.timeouts += 1
        if ok:
            with self._lock:
                self.available = True
                self.stats.reconnects += 1
            logger.warning("host tier %s reachable again: back in use", self.store.name)

    # ---- lifecycle ----------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every staged write-back and removal has reached the store and every fetch started
        has finished (tests, benchmarks, shutdown)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._writer.pending or self._fetches:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("host tier writes still pending")
            time.sleep(0.001)

    def close(self) -> None:
        self._fetcher.shutdown(wait=True, cancel_futures=True)
        self.landing.drain()
        self._writer.close()
        self.store.close()
        if self._staging is not None:
            self._staging.close()


def _started(future: Future) -> bool:
    """A read the fetch thread has begun or finished: one still queued behind others is not waited for."""
    return future.running() or future.done()
