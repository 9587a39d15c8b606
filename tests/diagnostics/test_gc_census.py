"""GcCensus: what the young generation holds at each collection, by type and container elements."""

import gc

import torch

from flashstate.gc_pauses import GcPauses


class _Owner:
    __slots__ = ("tensor",)


def test_a_census_counts_the_young_generation_and_its_largest_containers():
    pauses = GcPauses(census=True).install()
    try:
        gc.collect()
        owner = _Owner()
        owner.tensor = torch.zeros(4, dtype=torch.int64)[1:]
        kept = [list(range(5000)) for _ in range(3)] + [{"a": 1}, owner]
        gc.collect(0)
    finally:
        pauses.uninstall()
    census = pauses.census
    assert census.collections == 1 and pauses.count[0] == 1
    assert census.objects["list"] >= 3 and census.elements["list"] >= 15000
    assert census.largest[0] == (5000, "list[int]")
    assert census.tensors["cpu int64 1-d view"] == 1
    assert census.holders == {"_Owner": 1}  # what holds the one young tensor
    text = census.describe()
    assert text.startswith("1 collections") and "list[int] ×5000" in text and "cpu int64 1-d view 1" in text
    assert "holders: _Owner ×1" in text
    del kept


def test_without_a_census_nothing_is_walked():
    pauses = GcPauses().install()
    try:
        gc.collect(0)
    finally:
        pauses.uninstall()
    assert pauses.census is None and pauses.count[0] == 1
