"""HostArena: ranges carved from one buffer, freed only when no tensor views them, coalesced; a full
arena answers None; and the memory store's tier skips a write-back the arena cannot hold."""

import gc
import random

import pytest
import torch

from flashstate.cache.host.arena import ALIGN, HostArena
from flashstate.cache.host.store import MemoryStore
from tests.cache.host.conftest import BLOCK, make_caches, make_tier


def test_ranges_are_disjoint_and_hold_their_bytes():
    arena = HostArena(16 * ALIGN)
    bufs = [arena.allocate(ALIGN + 7 * i) for i in range(4)]
    assert all(b is not None for b in bufs)
    assert [b.numel() for b in bufs] == [ALIGN + 7 * i for i in range(4)]
    for i, b in enumerate(bufs):
        b.fill_(i + 1)
    for i, b in enumerate(bufs):
        assert torch.all(b == i + 1)
    assert arena.free_bytes == 16 * ALIGN - (1 + 2 + 2 + 2) * ALIGN


def test_a_range_frees_only_when_its_last_view_is_gone():
    arena = HostArena(4 * ALIGN)
    buf = arena.allocate(4 * ALIGN)
    assert arena.allocate(1) is None  # full
    part = buf[ALIGN:].view(torch.int32)  # e.g. a tensor of a fetched object, still read by a restore
    del buf
    gc.collect()
    assert arena.allocate(1) is None
    part.fill_(7)
    del part
    gc.collect()
    again = arena.allocate(4 * ALIGN)
    assert again is not None and arena.free_bytes == 0


def test_freed_neighbours_coalesce_into_one_range():
    arena = HostArena(8 * ALIGN)
    bufs = [arena.allocate(2 * ALIGN) for _ in range(4)]
    del bufs[2], bufs[0]  # frees ranges 0 and 2: no 4-block range yet
    gc.collect()
    assert arena.allocate(3 * ALIGN) is None
    del bufs[0]  # range 1: 0..2 join into 6 blocks
    gc.collect()
    assert arena.allocate(6 * ALIGN) is not None


def test_random_churn_never_overlaps_and_returns_every_byte():
    arena = HostArena(64 * ALIGN)
    rng = random.Random(0)
    live: dict[int, torch.Tensor] = {}
    for step in range(2000):
        if live and rng.random() < 0.5:
            del live[rng.choice(list(live))]
        else:
            buf = arena.allocate(rng.randrange(1, 5 * ALIGN))
            if buf is not None:
                buf.fill_(step % 251)
                live[step] = buf
        for s, b in live.items():  # no range was handed out twice: every buffer keeps its own bytes
            assert int(b[0]) == s % 251 and int(b[-1]) == s % 251
    live.clear()
    del buf, b
    gc.collect()
    assert arena.free_bytes == 64 * ALIGN
    assert arena.allocate(64 * ALIGN) is not None


def test_bad_size_is_refused():
    with pytest.raises(ValueError, match="host arena size"):
        HostArena(0)


def test_write_back_the_arena_cannot_hold_is_skipped_and_leaves_the_index_clean():
    caches = make_caches(seed=2)
    store = MemoryStore(1 << 20)
    tier = make_tier(store, caches)
    hog = store.arena.allocate(store.arena.free_bytes)  # something else holds the whole arena
    tokens = list(range(20))
    tier.write_back(tokens, 20, list(range(-(-20 // BLOCK))), slot=1)
    tier.flush()
    assert (
        tier.stats.writes_skipped == tier.stats.writes_without_buffer == 1 and tier.stats.writes_refused == 0
    )
    assert tier.num_states == 0 and tier.used == 0
    assert tier.lookup(tokens + [1], limit=20) is None
    del hog
    gc.collect()
    tier.write_back(tokens, 20, list(range(-(-20 // BLOCK))), slot=1)
    tier.flush()
    assert tier.stats.states_written == 1 and tier.lookup(tokens + [1], limit=20).depth == 20
    tier.close()
