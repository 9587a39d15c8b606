"""`--mamba-fallback-checkpoints auto`: the block-boundary fallbacks are spare exports, taken only while the
cache holds them without evicting anything. At ample memory auto is `sparse` (a checkpoint at every block
boundary a prefill passes); once the budget is full it is `retry`: the same tree, the same evictions.

The engines are the simulator's (the real scheduler and cache manager, pools as counters), as in
tests/cache/test_dominance.py.
"""

from __future__ import annotations

import random

import pytest

from flashstate.config import EngineConfig
from tests.cache.test_dominance import AMPLE, BLOCK, VOCAB, engine, run_one

WORKING = 4 * 58368  # max_num_seqs working states of the tiny model (57 KiB each)
TIGHT = WORKING + 400 * 1024  # about five short sessions' frontiers (a state and 4 blocks of 8 tokens)
LONG = 300  # the prompt that passes 9 block boundaries


def checkpoints(sim) -> set[int]:
    return {n.end for n in sim.cache.tree.nodes() if n.slot is not None}


def history(sim) -> tuple[set[int], dict[str, int], list[int]]:
    """Fill the cache with short sessions (no block boundary inside them), then one long prompt; the tree's
    checkpoint depths, the evictions and the cached tokens of every request."""
    rng = random.Random(0)
    cached = []
    for k in range(12):
        prompt = [rng.randrange(VOCAB) for _ in range(BLOCK - 4)]
        cached.append(run_one(sim, f"fill{k}", prompt, 2, seed=k)[0])
    long = [rng.randrange(VOCAB) for _ in range(LONG)]
    cached.append(run_one(sim, "long", long, 2, seed=99)[0])
    return checkpoints(sim), dict(sim.cache.stats.evictions), cached


def test_ample_memory_exports_every_block_boundary():
    sim = engine("flashstate", AMPLE, mamba_fallback_checkpoints="auto")
    depths, evictions, _ = history(sim)
    assert not evictions
    boundaries = set(range(BLOCK, LONG, BLOCK))
    assert boundaries <= depths  # the long prompt's 9 boundaries, beside its retry point and frontier
    assert {LONG - 1, LONG + 1} <= depths
    assert sim.cache.spare_exports == [0, len(boundaries)]  # none skipped, all taken


def test_a_full_budget_plans_no_block_boundary_export():
    """Once the budget is full, auto leaves no block-boundary checkpoint and evicts what retry does."""
    auto = engine("flashstate", TIGHT, mamba_fallback_checkpoints="auto")
    retry = engine("flashstate", TIGHT, mamba_fallback_checkpoints="retry")
    got = history(auto)
    assert got == history(retry)
    depths, evictions, _ = got
    assert evictions.get("capacity_kv", 0) + evictions.get("capacity_state", 0) > 0  # the budget was full
    assert not depths & set(range(BLOCK, LONG, BLOCK))
    skipped, taken = auto.cache.spare_exports
    assert skipped == LONG // BLOCK and taken == 0


def test_spare_checkpoints_are_the_first_victims():
    """Spares fill memory nothing else wants: every unit the budget evicts is a spare until none is left,
    and no spare eviction raises the GDS clock. A spare a request hits is a priced unit from then on."""
    sim = engine("flashstate", WORKING + 1024 * 1024, mamba_fallback_checkpoints="auto")
    rng = random.Random(1)
    long = [rng.randrange(VOCAB) for _ in range(LONG)]
    run_one(sim, "long", long, 2, seed=99)
    assert set(range(BLOCK, LONG, BLOCK)) <= checkpoints(sim)
    assert run_one(sim, "edit", long[:230] + [1, 2], 2, seed=98)[0] == 224  # hits the spare at 224
    spares = LONG // BLOCK - 1
    for k in range(12):
        clock = sim.cache.policy.clock
        prompt = [rng.randrange(VOCAB) for _ in range(BLOCK - 4)]
        run_one(sim, f"fill{k}", prompt, 2, seed=k)
        ev = sim.cache.stats.evictions
        priced = ev["capacity_state"] + ev["capacity_kv"]
        assert not priced or ev["spare"] == spares, (k, ev)
        if not priced:
            assert sim.cache.policy.clock == clock
    assert ev["spare"] == spares and priced > 0


def test_auto_is_the_default():
    assert EngineConfig().mamba_fallback_checkpoints == "auto"


@pytest.mark.parametrize("value", ["dense", "Auto", ""])
def test_unknown_modes_are_refused(value):
    with pytest.raises(ValueError, match="off, retry, sparse or auto"):
        EngineConfig(mamba_fallback_checkpoints=value)
