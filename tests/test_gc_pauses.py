import gc

import pytest

from flashstate.gc_pauses import GEN0_THRESHOLD, GcPauses, for_serving


@pytest.fixture
def restore_gc():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_pauses_are_counted_per_generation_while_installed():
    pauses = GcPauses().install()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        pauses.uninstall()
    gc.collect(1)  # not seen
    assert pauses.count[0] >= 1 and pauses.count[2] >= 2 and pauses.count[1] == 0
    assert pauses.seconds[2] >= pauses.longest[2] > 0
    text = pauses.describe()
    assert text.startswith("gen0 ") and "gen2 " in text and "longest" in text and "over 50 ms" in text


def test_cyclic_garbage_freed_by_a_collection_is_counted():
    class Node:
        pass

    gc.collect()
    pauses = GcPauses().install()
    try:
        for _ in range(10):
            a, b = Node(), Node()
            a.other, b.other = b, a  # a cycle: only the collector frees it
        del a, b
        gc.collect(0)
    finally:
        pauses.uninstall()
    assert pauses.collected[0] >= 20  # 10 pairs of nodes (and their __dict__s)
    assert "objects collected" in pauses.describe()


def test_a_pause_over_50_ms_counts_as_long():
    pauses = GcPauses()
    for seconds in (0.01, 0.06, 0.2):
        pauses._on_gc("start", {"generation": 0})
        pauses._start -= seconds  # as if the collection had started that long ago
        pauses._on_gc("stop", {"generation": 0, "collected": 0})
    assert pauses.count[0] == 3 and pauses.long[0] == 2 and pauses.longest[0] >= 0.2


def test_for_serving_freezes_what_is_alive_and_raises_the_young_threshold(restore_gc):
    survivors = [[i] for i in range(1000)]  # tracked containers alive at "start-up"
    frozen = for_serving()
    assert frozen >= len(survivors)  # (frozen objects freed since by reference counting leave the count)
    assert gc.get_threshold()[0] == GEN0_THRESHOLD
    walked = {id(o) for g in range(3) for o in gc.get_objects(g)}
    assert not any(id(x) in walked for x in survivors)
