"""HostIndex alone: chunks shared by reference count, whole-state GDS eviction that reports every object
it drops, refusal of a state worth less than what it would evict, and readiness before restore."""

from flashstate.cache.host.index import HostIndex


def _index(capacity: int) -> tuple[HostIndex, list[str]]:
    removed: list[str] = []
    return HostIndex(capacity, saved=lambda depth: float(depth), on_remove=removed.append), removed


def test_shared_chunks_are_counted_once_and_leave_with_their_last_state():
    index, removed = _index(1000)
    assert index.admit("s1", 20, b"b1", ["c1", "c2"], state_bytes=10, chunk_bytes=100)
    assert index.admit("s2", 30, b"b2", ["c1", "c2", "c3"], state_bytes=10, chunk_bytes=100)
    assert index.used == 10 + 200 + 10 + 100 and index.chunks["c1"].refs == 2
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
