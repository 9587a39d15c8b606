"""HostIndex alone: chunks shared by reference count, whole-state GDS eviction that reports every object
it drops, refusal of a state worth less than what it would evict, and readiness before restore."""

import random

from flashstate.cache.host.index import HostIndex


def assert_consistent(index: HostIndex) -> None:
    """Each chunk's holders are the states that list it; each state's exclusive bytes are its chunks held
    by it alone; `used` is every indexed object's bytes."""
    for key, chunk in index.chunks.items():
        assert chunk.holders == {s.key for s in index.states.values() if key in s.chunks}
    for s in index.states.values():
        assert s.exclusive == sum(index.chunks[k].nbytes for k in s.chunks if index.chunks[k].refs == 1)
    assert index.used == sum(s.nbytes for s in index.states.values()) + sum(
        c.nbytes for c in index.chunks.values()
    )


def _index(capacity: int) -> tuple[HostIndex, list[str]]:
    removed: list[str] = []
    return HostIndex(capacity, saved=lambda depth: float(depth), on_remove=removed.append), removed


def test_shared_chunks_are_counted_once_and_leave_with_their_last_state():
    index, removed = _index(1000)
    assert index.admit("s1", 20, b"b1", ["c1", "c2"], state_bytes=10, chunk_bytes=100)
    assert index.admit("s2", 30, b"b2", ["c1", "c2", "c3"], state_bytes=10, chunk_bytes=100)
    assert index.used == 10 + 200 + 10 + 100 and index.chunks["c1"].refs == 2
    assert_consistent(index)
    index.forget(index.states["s2"])
    assert removed == ["s2", "c3"] and index.used == 210
    index.forget_object("c1")  # gone from the store: every state that needs it goes too
    assert removed == ["s2", "c3", "s1", "c1", "c2"] and index.used == 0 and len(index) == 0


def test_eviction_takes_the_cheapest_ready_state_and_refuses_a_poorer_newcomer():
    index, removed = _index(250)
    assert index.admit("deep", 200, b"b", ["c1"], state_bytes=20, chunk_bytes=100)
    assert index.admit("shallow", 10, b"b", ["c2"], state_bytes=20, chunk_bytes=100)
    assert not index.admit("x", 100, b"x", [], state_bytes=50, chunk_bytes=100)  # nothing ready to evict
    index.mark_written("deep", ["c1"])
    index.mark_written("shallow", ["c2"])
    assert index.admit("mid", 100, b"m", [], state_bytes=50, chunk_bytes=100)
    assert removed == ["shallow", "c2"] and index.evictions == 1 and index.used == 170
    assert not index.admit("poor", 1, b"p", [], state_bytes=100, chunk_bytes=100)  # worth less than "deep"
    assert set(index.states) == {"deep", "mid"}
    assert_consistent(index)


def test_a_pinned_state_is_not_evicted_until_unpinned():
    """A restore reading a state pins it: an in-process store would hand its bytes to the next write-back."""
    index, removed = _index(250)
    for key, depth, chunk in (("deep", 200, "c1"), ("shallow", 10, "c2")):
        assert index.admit(key, depth, b"b", [chunk], state_bytes=20, chunk_bytes=100)
        index.mark_written(key, [chunk])
    index.pin("shallow", 1)
    assert index.admit("mid", 100, b"m", [], state_bytes=50, chunk_bytes=100)  # evicts "deep" instead
    assert removed == ["deep", "c1"] and "shallow" in index.states
    index.pin("shallow", -1)
    index.mark_written("mid", [])
    assert index.admit("next", 150, b"n", [], state_bytes=100, chunk_bytes=100)
    assert removed[2:] == ["shallow", "c2"]
    index.pin("gone", 1)  # a state no longer held: nothing to pin
    assert_consistent(index)


def test_touch_restamps_and_mark_written_needs_the_state_still_there():
    index, _ = _index(1000)
    assert not index.touch("s") and not index.mark_written("s", [])
    index.admit("s", 5, b"b", [], state_bytes=10, chunk_bytes=100)
    index.clock = 7.0
    assert index.touch("s") and index.states["s"].priority == 7.0


def test_making_room_keeps_the_chunks_the_newcomer_shares_with_the_state_it_evicts():
    # An agent's next turn extends its previous state: evicting that state must not drop the chunks the
    # new state reuses (the writer will not write them again).
    index, removed = _index(350)
    assert index.admit("turn1", 200, b"b1", ["c1", "c2"], state_bytes=100, chunk_bytes=100)
    index.mark_written("turn1", ["c1", "c2"])
    # worth more per byte it adds (300 / 120) than turn1 per byte its eviction frees (200 / 100)
    assert index.admit("turn2", 300, b"b2", ["c1", "c2", "c3"], state_bytes=20, chunk_bytes=100)
    assert removed == ["turn1"] and set(index.chunks) == {"c1", "c2", "c3"}
    assert index.chunks["c1"].refs == 1 and index.chunks["c1"].ready
    assert index.used == 20 + 300
    assert_consistent(index)


def test_a_refused_newcomer_leaves_no_orphan_chunks_behind():
    index, removed = _index(400)
    assert index.admit("a", 100, b"b1", ["c1"], state_bytes=100, chunk_bytes=100)
    assert index.admit("d", 1000, b"b2", ["c5"], state_bytes=50, chunk_bytes=100)
    index.mark_written("a", ["c1"])
    index.mark_written("d", ["c5"])
    # room for "big" evicts "a" (whose chunk c1 it shares), then stops at "d", worth more: refused
    assert not index.admit("big", 600, b"b3", ["c1", "c2", "c3"], state_bytes=50, chunk_bytes=100)
    assert removed == ["a", "c1"] and set(index.states) == {"d"} and set(index.chunks) == {"c5"}
    assert index.used == 50 + 100
    assert_consistent(index)


def test_random_admissions_evictions_and_lost_objects_keep_the_bookkeeping_exact():
    rng = random.Random(5)
    index, removed = _index(3000)
    paths = [[f"p{p}c{i}" for i in range(12)] for p in range(4)]  # four agents' chunk chains
    for step in range(600):
        p = rng.randrange(4)
        depth = rng.randint(1, 12)
        key = f"s{step}"
        admitted = index.admit(key, depth * 10, key.encode(), paths[p][:depth], rng.randint(5, 60), 100)
        if admitted and rng.random() < 0.9:  # the rest stay pending: never evicted
            index.mark_written(key, [k for k in paths[p][:depth] if not index.chunks[k].ready])
        if rng.random() < 0.03 and index.chunks:
            index.forget_object(rng.choice(sorted(index.chunks)))
        assert index.used <= index.capacity
        assert_consistent(index)
    assert index.evictions > 50 and len(removed) > 100
