"""The host tier under capacity pressure, as 48 agents put it there: agents whose every turn extends the
previous one write back state after state into a store that holds a few of them. Each new turn evicts older
states that share its chunks; the store, the index and the arena must stay consistent, the newest turns
must keep being written, and whatever is restored must be exactly what was written."""

import random

import torch

from flashstate.cache.cache_tensors import CacheTensors
from flashstate.cache.host.store import MemoryStore
from tests.cache.host.conftest import BLOCK, make_tier
from tests.cache.host.test_index import assert_consistent

NUM_BLOCKS = 160


def _caches() -> CacheTensors:
    """Chunks of 128 KiB: the arena's 4 KiB alignment then costs what it does on real, MiB-sized ones."""
    g = torch.Generator().manual_seed(7)
    kv = [
        (
            torch.randn(NUM_BLOCKS, BLOCK, 2, 512, generator=g),
            torch.randn(NUM_BLOCKS, BLOCK, 2, 512, generator=g),
        )
        for _ in range(2)
    ]
    states = [(torch.randn(12, 64, 3, generator=g), torch.randn(12, 2, 32, 32, generator=g))]
    return CacheTensors(kv, states, pad_block=NUM_BLOCKS - 1, pad_slot=11)


def _blocks(depth: int, first: int = 0) -> list[int]:
    return list(range(first, first + -(-depth // BLOCK)))


def _state_bytes(caches: CacheTensors, depth: int) -> int:
    """What one state at `depth` (its chunks and its state object) takes in the store."""
    probe = make_tier(MemoryStore(1 << 30), caches)
    probe.write_back(list(range(1, depth + 1)), depth, _blocks(depth), 0)
    probe.flush()
    used = probe.used
    probe.close()
    return used


def _restored_equal(caches: CacheTensors, depth: int, src_slot: int, dst_slot: int) -> bool:
    src, dst = _blocks(depth), _blocks(depth, first=80)
    for pair in caches.kv:
        for t in pair:
            a = t[torch.tensor(dst)].flatten(0, 1)[:depth]
            b = t[torch.tensor(src)].flatten(0, 1)[:depth]
            if not torch.equal(a, b):
                return False
    return all(torch.equal(s[dst_slot], s[src_slot]) for pair in caches.states for s in pair)


def test_growing_agents_under_pressure_keep_the_tier_consistent_and_writing():
    caches = _caches()
    store = MemoryStore(3 * _state_bytes(caches, 300))
    tier = make_tier(store, caches)
    rng = random.Random(0)
    agents = [[rng.randrange(1, 1000) for _ in range(rng.randint(20, 60))] for _ in range(6)]
    newest_found = restores = 0
    for _ in range(10):
        for a, tokens in enumerate(agents):
            if len(tokens) + 40 > 300:
                continue
            tokens.extend(rng.randrange(1, 1000) for _ in range(rng.randint(5, 40)))
            depth = len(tokens)
            tier.write_back(tokens, depth, _blocks(depth), slot=a)
            if rng.random() < 0.5:
                tier.flush()
            hit = tier.lookup(tokens + [1], limit=depth)
            if hit is not None and rng.random() < 0.3:
                objects = tier.fetch(hit)
                assert objects is not None
                tier.load(hit, objects, _blocks(hit.depth, first=80), slot=10)
                assert _restored_equal(caches, hit.depth, a, 10)
                restores += 1
        tier.flush()
        for tokens in agents:
            hit = tier.lookup(tokens + [1], limit=len(tokens))
            newest_found += hit is not None and hit.depth == len(tokens)
        # the store holds exactly the index's objects, within capacity
        indexed = set(tier.index.states) | set(tier.index.chunks)
        assert set(store._objects) == indexed
        assert tier.used == store.used <= tier.capacity
        assert_consistent(tier.index)
    stats = tier.stats
    assert stats.evictions > 20 and restores > 5
    assert stats.writes_skipped <= stats.states_written // 4, stats
    assert stats.writes_without_buffer == 0  # room is made before buffers are taken
    assert stats.writes_skipped == stats.writes_refused
    assert newest_found >= 20  # the agents' newest states are what the tier holds most often
    tier.close()


def test_a_full_store_makes_room_before_the_newcomer_needs_its_buffers():
    # The arena holds capacity * 9/8: a newcomer larger than that slack fits only into its victims' ranges.
    caches = _caches()
    store = MemoryStore(4 * _state_bytes(caches, 40))
    tier = make_tier(store, caches)
    for a in range(4):
        tier.write_back([1000 + 100 * a + i for i in range(40)], 40, _blocks(40), slot=a)
    tier.flush()
    assert tier.stats.states_written == 4 and store.used > 0.95 * store.capacity
    deep = list(range(5000, 5080))  # twice as deep: worth more per byte than any state it evicts
    tier.write_back(deep, 80, _blocks(80), slot=5)
    tier.flush()
    assert tier.stats.writes_skipped == 0 and tier.stats.evictions >= 2
    assert tier.lookup(deep + [1], limit=80).depth == 80
    assert tier.used == store.used <= tier.capacity
    tier.close()
