"""The host tier on both stores (the embedded one and a real mooncake_master): round trip, writing only
what the store lacks, GDS eviction under capacity, dropped and corrupt objects as misses, outages."""

import gc
import random
import threading
import time
from concurrent.futures import wait

import pytest
import torch

from flashstate.cache.host.arena import HostArena
from flashstate.cache.host.codec import encode
from flashstate.cache.host.prefetch import MAX_PREFETCHES
from flashstate.cache.host.restore import RestorePhase
from flashstate.cache.host.store import MemoryStore, StoreUnavailableError
from flashstate.cache.host.tier import FETCH_THREADS
from tests.cache.host.conftest import BLOCK, CHUNK, make_caches, make_tier


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def _blocks(depth: int, first: int = 0) -> list[int]:
    return list(range(first, first + -(-depth // BLOCK)))


def _kv_prefix(caches, blocks, depth):
    return [t[torch.tensor(blocks)].flatten(0, 1)[:depth] for pair in caches.kv for t in pair]


def test_round_trip_restores_kv_and_state_exactly(new_store):
    caches = make_caches(seed=1)
    tier = make_tier(new_store(), caches)
    tokens = _tokens(22, 0)  # two full chunks of 8 and a tail of 6
    tier.write_back(tokens, 22, _blocks(22), slot=3)
    tier.flush()
    assert tier.stats.states_written == 1 and tier.stats.objects_written == 3
    hit = tier.lookup(tokens + [5, 6, 7], limit=24)
    assert hit is not None and hit.depth == 22 and len(hit.chunks) == 2
    objects = tier.fetch(hit)
    assert objects is not None
    restore_to = _blocks(22, first=30)  # other blocks and another slot of the same (random) caches
    assert not torch.equal(caches.states[0][1][5], caches.states[0][1][3])
    tier.load(hit, objects, restore_to, slot=5)
    for a, b in zip(_kv_prefix(caches, restore_to, 22), _kv_prefix(caches, _blocks(22), 22), strict=True):
        assert torch.equal(a, b)
    for conv, ssm in caches.states:
        assert torch.equal(conv[5], conv[3]) and torch.equal(ssm[5], ssm[3])
    assert tier.stats.restores == 1 and tier.stats.restored_tokens == 22
    tier.close()


def test_lookup_needs_the_exact_prefix_and_a_depth_within_the_limit(new_store):
    tier = make_tier(new_store(), make_caches())
    tokens = _tokens(22, 0)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    assert tier.lookup(tokens, limit=21) is None  # the state is deeper than the limit
    diverged = tokens[:20] + [t + 1 for t in tokens[20:]]
    assert tier.lookup(diverged + [1], limit=22) is None  # differs in the tail
    assert tier.lookup([tokens[0] + 1, *tokens[1:]], limit=22) is None  # differs in chunk 0
    assert tier.lookup(tokens + [1], limit=22).depth == 22
    tier.close()


def test_a_longer_turn_writes_only_the_chunks_the_store_lacks(new_store):
    tier = make_tier(new_store(), make_caches())
    first = _tokens(22, 0)
    tier.write_back(first, 22, _blocks(22), 0)
    tier.flush()
    turn = first + _tokens(19, 1)  # 41 tokens: chunks 0, 1 shared, chunks 2..4 new, tail 1
    tier.write_back(turn, 41, _blocks(41), 1)
    tier.write_back(turn, 41, _blocks(41), 1)  # the same state again: nothing to write
    tier.flush()
    assert tier.stats.states_written == 2
    assert tier.stats.objects_written == 3 + 4  # (2 chunks + state) then (3 chunks + state)
    assert tier.lookup(turn + [9], limit=41).depth == 41
    assert tier.lookup(first + [9], limit=22).depth == 22
    tier.close()


def test_eviction_keeps_capacity_and_drops_the_lowest_priority_state_whole(new_store):
    store = new_store()
    caches = make_caches()
    probe = make_tier(MemoryStore(1 << 30), caches)
    probe.write_back(_tokens(40, 0), 40, _blocks(40), 0)
    long_bytes = probe.used
    probe.close()
    # Room for two 40-token states: a third state must evict one.
    tier = make_tier(store, caches, capacity=2 * long_bytes)
    a, b, c = _tokens(40, 10), _tokens(12, 11), _tokens(40, 12)
    tier.write_back(a, 40, _blocks(40), 0)
    tier.write_back(b, 12, _blocks(12), 1)  # short: saves the least prefill per byte
    tier.flush()
    tier.write_back(c, 40, _blocks(40), 2)
    tier.flush()
    assert tier.used <= tier.capacity and tier.stats.evictions == 1
    assert tier.lookup(b + [1], 12) is None  # GDS: the short state went, not the older long one
    assert tier.lookup(a + [1], 40).depth == 40 and tier.lookup(c + [1], 40).depth == 40
    b_keys = [tier.layout.chunk_key(h) for h in tier.layout.chain(b, 12)[1:]]
    assert b_keys and not any(store.exists(k) for k in b_keys)  # its objects left the store too
    tier.close()


def test_an_object_the_store_dropped_is_a_miss_read_no_further(new_store):
    store = new_store()
    tier = make_tier(store, make_caches())
    tokens = _tokens(22, 0)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    hit = tier.lookup(tokens + [1], 22)
    store.remove(hit.chunks[1])
    read = []
    get = store.get
    store.get = lambda key: read.append(key) or get(key)
    assert tier.fetch(hit) is None
    assert read == hit.chunks[:2]  # not the state object after the missing chunk: a miss either way
    assert tier.stats.misses_dropped == 1 and tier.lookup(tokens + [1], 22) is None
    tier.close()


def test_a_corrupt_object_is_a_miss_never_a_restore(new_store):
    store = new_store()
    tier = make_tier(store, make_caches())
    tokens = _tokens(22, 0)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    hit = tier.lookup(tokens + [1], 22)
    good = store.get(hit.key).clone()
    bad = good.clone()
    bad[-1] ^= 1  # one bit of the last tensor
    store.remove(hit.key)
    assert store.put(hit.key, bad)
    assert tier.fetch(hit) is None
    assert tier.stats.misses_corrupt == 1 and tier.lookup(tokens + [1], 22) is None
    tier.close()


class _FlakyStore(MemoryStore):
    down = False

    def put(self, key, data):
        if self.down:
            raise StoreUnavailableError("master gone")
        return super().put(key, data)

    def ping(self):
        return not self.down


def test_an_unreachable_store_is_one_outage_then_a_reconnect():
    store = _FlakyStore(1 << 20)
    tier = make_tier(store, make_caches(), retry=0.05)
    tokens = _tokens(22, 0)
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    store.down = True
    tier.write_back(_tokens(22, 1), 22, _blocks(22), 1)
    tier.flush()
    tier.write_back(_tokens(22, 2), 22, _blocks(22), 2)  # no-op while unavailable
    assert not tier.available and tier.stats.outages == 1
    assert tier.lookup(tokens + [1], 22) is None  # the index went with the store
    store.down = False
    for _ in range(500):
        if tier.available:
            break
        time.sleep(0.01)
    assert tier.available and tier.stats.reconnects == 1
    tier.write_back(tokens, 22, _blocks(22), 0)
    tier.flush()
    assert tier.lookup(tokens + [1], 22).depth == 22
    tier.close()


def test_objects_are_raw_tensors_behind_a_header():
    buf = encode("k", [torch.arange(4, dtype=torch.float32)])
    assert bytes(buf[:4].numpy()) == b"FSH2"
    assert torch.equal(buf[-64:-48].view(torch.float32), torch.arange(4, dtype=torch.float32))
    assert CHUNK % BLOCK == 0


def _staged(store, seed: int):
    """A tier fetching through a staging arena, holding one 22-token state written from slot 2: (caches,
    staging, tier, tokens, hit)."""
    caches = make_caches(seed=seed)
    staging = HostArena(1 << 20)
    tier = make_tier(store, caches, staging=staging)
    tokens = _tokens(22, seed + 1)
    tier.write_back(tokens, 22, _blocks(22), slot=2)
    tier.flush()
    return caches, staging, tier, tokens, tier.lookup(tokens + [1], limit=22)


def test_fetched_objects_pass_through_staging_and_free_it_when_dropped(new_store):
    caches, staging, tier, tokens, hit = _staged(new_store(), seed=3)
    objects = tier.fetch(hit)
    assert staging.free_bytes < staging.nbytes  # the objects now live in staging memory
    tier.load(hit, objects, _blocks(22, first=30), slot=6)
    for a, b in zip(
        _kv_prefix(caches, _blocks(22, first=30), 22), _kv_prefix(caches, _blocks(22), 22), strict=True
    ):
        assert torch.equal(a, b)
    assert all(torch.equal(conv[6], conv[2]) and torch.equal(ssm[6], ssm[2]) for conv, ssm in caches.states)
    del objects, a, b
    gc.collect()
    assert staging.free_bytes == staging.nbytes
    tiny = make_tier(new_store(), caches, staging=HostArena(4096))  # too small: the store's own buffers
    tiny.write_back(tokens, 22, _blocks(22), slot=2)
    tiny.flush()
    assert tiny.fetch(tiny.lookup(tokens + [1], limit=22)) is not None
    tier.close()
    tiny.close()


@pytest.mark.parametrize("cancel", [False, True])
def test_a_dropped_restore_frees_its_fetched_objects_without_the_collector(new_store, cancel):
    _, staging, tier, _, hit = _staged(new_store(), seed=5)
    gc.collect()
    gc.disable()  # refcounting alone must free a restore: the collector pauses the engine to find cycles
    try:
        restore = tier.start_restore(hit, 0, 22, _blocks(22, first=30), slot=6)
        if cancel:
            restore.cancel()
        wait([restore.future], timeout=10)  # the fetch has finished (or was cancelled before it started)
        if not cancel:
            assert restore.poll().value == "ready" and restore.fetched_at is not None
            assert staging.free_bytes < staging.nbytes  # the fetched objects live in staging memory
        del restore
        tier.landing.prune()
        assert staging.free_bytes == staging.nbytes
        deadline = time.monotonic() + 10  # a cancelled fetch that was running unpins in its done callback
        while tier.index.states[hit.key].pins and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tier.index.states[hit.key].pins == 0
    finally:
        gc.enable()
    tier.close()


def test_a_restore_takes_over_the_read_ahead_that_covers_it(new_store):
    """cache/host/prefetch.py: the in-process store's hit is read ahead in the background (Mooncake's is not:
    its restores are read in the background anyway). A restore from a later chunk (the GPU tree shared more
    KV since) skips the chunks it does not need and equals the state written; one from an earlier chunk
    drops the read-ahead and reads for itself. No state stays pinned, and at most MAX_PREFETCHES are held."""
    store = new_store()
    caches = make_caches(seed=7)
    tier = make_tier(store, caches, prefetch=True)
    tokens = _tokens(22, 8)
    tier.write_back(tokens, 22, _blocks(22), slot=2)
    tier.flush()
    hit = tier.lookup(tokens + [1], limit=22)
    if not isinstance(store, MemoryStore):
        assert tier.prefetch(hit, 0) is None
        tier.close()
        return
    ahead = tier.prefetch(hit, 0)
    wait([ahead.future], timeout=10)
    restore_to = _blocks(22, first=30)
    for block_from, block_to in zip(_blocks(8), restore_to[:2], strict=True):  # chunk 0 shared from the GPU
        for pair in caches.kv:
            for t in pair:
                t[block_to] = t[block_from]
    restore = tier.start_restore(hit, 1, 22, restore_to, slot=6, prefetched=ahead)
    assert restore.inline and restore.skip == 1 and restore.poll() is RestorePhase.READY
    assert restore.fetched_at == ahead.fetched_at
    for a, b in zip(_kv_prefix(caches, restore_to, 22), _kv_prefix(caches, _blocks(22), 22), strict=True):
        assert torch.equal(a, b)
    assert all(torch.equal(conv[6], conv[2]) and torch.equal(ssm[6], ssm[2]) for conv, ssm in caches.states)
    late = tier.prefetch(hit, 1)  # cannot serve a restore from chunk 0
    restore = tier.start_restore(hit, 0, 22, _blocks(22, first=40), slot=5, prefetched=late)
    assert restore.prefetch is None and restore.poll() is RestorePhase.READY
    held = [tier.prefetch(hit, 0) for _ in range(MAX_PREFETCHES + 1)]
    assert held[-1] is None and all(held[:-1])
    for p in held[:-1]:
        p.drop()
    tier.flush()
    deadline = time.monotonic() + 10  # a dropped read unpins in its done callback
    while tier.index.states[hit.key].pins and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tier.index.states[hit.key].pins == 0
    assert (tier.stats.prefetches, tier.stats.prefetches_used) == (2 + MAX_PREFETCHES, 1)
    tier.close()


def test_a_restore_waits_for_a_running_read_ahead_and_drops_a_queued_one():
    """A read-ahead the fetch thread is running when its request is admitted is waited for (the sequence runs
    in the admitting step); one still queued behind other work is dropped and the restore reads inline. Both
    restore the state written, and no state stays pinned."""
    caches = make_caches(seed=9)
    tier = make_tier(MemoryStore(64 << 20), caches, prefetch=True)
    tokens = _tokens(22, 9)
    tier.write_back(tokens, 22, _blocks(22), slot=2)
    tier.flush()
    hit = tier.lookup(tokens + [1], limit=22)

    def restored(first_block: int, slot: int) -> bool:
        table = _blocks(22, first=first_block)
        same_kv = all(
            torch.equal(a, b)
            for a, b in zip(_kv_prefix(caches, table, 22), _kv_prefix(caches, _blocks(22), 22), strict=True)
        )
        return same_kv and all(torch.equal(c[slot], c[2]) for pair in caches.states for c in pair)

    busy = threading.Event()
    for _ in range(FETCH_THREADS):  # every fetch thread busy: the next read waits in the queue
        tier._fetcher.submit(busy.wait, 10)
    queued = tier.prefetch(hit, 0)
    restore = tier.start_restore(hit, 0, 22, _blocks(22, first=30), slot=6, prefetched=queued)
    assert restore.prefetch is None and restore.inline and restore.poll() is RestorePhase.READY
    assert restored(30, 6)
    busy.set()

    reading, release = threading.Event(), threading.Event()
    fetch = tier.fetch

    def held_fetch(hit, first_chunk):
        reading.set()
        release.wait(10)
        return fetch(hit, first_chunk)

    tier.fetch = held_fetch
    running = tier.prefetch(hit, 0)
    assert reading.wait(10)  # the read has begun and holds until released
    threading.Thread(target=release.set).start()  # whenever it runs, the admission below waits for it
    restore = tier.start_restore(hit, 0, 22, _blocks(22, first=40), slot=5, prefetched=running)
    assert restore.prefetch is running and restore.inline and restore.poll() is RestorePhase.READY
    assert restored(40, 5)
    tier.fetch = fetch
    tier.flush()
    deadline = time.monotonic() + 10  # the dropped read unpins in its done callback
    while tier.index.states[hit.key].pins and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tier.index.states[hit.key].pins == 0
    assert (tier.stats.prefetches, tier.stats.prefetches_used) == (2, 1)
    tier.close()


class _SharedMemoryStore(MemoryStore):
    """The embedded store as a shared one: two tiers on it stand for two engines on one Mooncake master."""

    shared = True


def test_a_shared_store_is_probed_at_any_depth_the_prompt_reaches():
    store = _SharedMemoryStore(1 << 30)
    caches = make_caches(num_blocks=128, seed=3)
    writer, reader = (make_tier(store, caches, fingerprint="shared") for _ in range(2))
    tokens = _tokens(200, 7)
    writer.write_back(tokens, 45, _blocks(45), 0)  # chunk 5 (depths 40..47): far below a 200-token prompt
    writer.flush()
    calls = []
    exists_many = store.exists_many
    store.exists_many = lambda keys: calls.append(len(keys)) or exists_many(keys)
    hit = reader.lookup(tokens, limit=199)
    assert hit is not None and hit.depth == 45 and hit.remote and len(hit.chunks) == 5
    # one check of the prompt's 24 chunk keys, then chunk 5's depths alone: not the 20 chunks above it
    assert calls == [199 // CHUNK, CHUNK]
    assert reader.lookup(tokens, limit=199, floor=45) is None  # nothing deeper than what the engine holds
    reader.load(hit, reader.fetch(hit), _blocks(45, first=60), slot=5)
    s = reader.stats
    assert (s.remote_hits, s.restores, s.remote_restores, s.remote_restored_tokens) == (1, 1, 1, 45)
    own = writer.lookup(tokens, limit=199)  # the writer finds it in its own index: not a remote restore
    assert own is not None and not own.remote
    writer.close()
    reader.close()
