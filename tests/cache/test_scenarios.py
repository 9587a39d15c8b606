"""Scenarios whose outcome the real systems are known to give (DESIGN.md §3)."""

import random

from flashstate import LLM, SamplingParams
from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cost import PrefillCost
from flashstate.cache.manager import CacheManager
from flashstate.cache.policy import Policy
from flashstate.cache.state_pool import StatePool
from flashstate.sequence import Sequence

PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def test_turn_ending_mid_block_is_a_full_hit_for_flashstate_and_aligned_for_vllm(tiny_model_dir):
    rng = random.Random(0)
    first = [rng.randrange(2000) for _ in range(300)]
    new = [rng.randrange(2000) for _ in range(25)]
    cached = {}
    for policy in ("flashstate", "vllm", "sglang", "none"):
        llm = LLM(
            tiny_model_dir,
            cache_policy=policy,
            block_size=16,
            mamba_block_size=64,
            prefill_cost_coefficients=(1e-5, 1e-8),
        )
        out = llm.generate(first, PARAMS)[0]
        second = llm.generate(first + out.token_ids + new, PARAMS)[0]
        cached[policy] = second.num_cached_tokens
        llm.engine.check_integrity()
    # The previous turn's KV ends after prompt + 9 generated tokens (the 10th was never fed back).
    assert cached["flashstate"] == 309 and 309 % 16
    assert cached["sglang"] == 309
    assert cached["vllm"] == 256 == 300 // 64 * 64
    assert cached["none"] == 0


def test_aligned_placement_hits_where_vllm_does(tiny_model_dir):
    """The ablation's placement: the flashstate policy restricted to vLLM's block-aligned checkpoints."""
    rng = random.Random(0)
    first = [rng.randrange(2000) for _ in range(300)]
    llm = LLM(
        tiny_model_dir,
        mamba_checkpoint_placement="aligned",
        block_size=16,
        mamba_block_size=64,
        prefill_cost_coefficients=(1e-5, 1e-8),
    )
    out = llm.generate(first, PARAMS)[0]
    second = llm.generate(first + out.token_ids + [5, 6, 7], PARAMS)[0]
    assert second.num_cached_tokens == 256
    llm.engine.check_integrity()


def test_prompt_sharing_part_of_an_earlier_prompt(tiny_model_dir):
    """vLLM hits only its block state below where the shared part ends; flashstate's (at ample memory) as
    well, and its branch-point export lets the third request resume exactly where the two diverged."""
    rng = random.Random(1)
    base = [rng.randrange(2000) for _ in range(200)]
    results = {}
    for policy in ("flashstate", "vllm"):
        llm = LLM(
            tiny_model_dir,
            cache_policy=policy,
            block_size=16,
            mamba_block_size=128,
            prefill_cost_coefficients=(1e-5, 1e-8),
        )
        llm.generate(base, PARAMS)
        a = llm.generate(base[:150] + [1, 2, 3] * 10, PARAMS)[0].num_cached_tokens
        b = llm.generate(base[:150] + [4, 5] * 10, PARAMS)[0].num_cached_tokens
        results[policy] = (a, b)
    assert results["vllm"] == (128, 128)  # the state at 128 < 150 is the only one on the path
    assert results["flashstate"][0] == 128  # the block-boundary fallback (`auto`), where vLLM's state is
    assert results["flashstate"][1] == 150  # the first branch exported its branch point


def _manager(policy: Policy, max_checkpoints: int, clock) -> CacheManager:
    return CacheManager(
        BlockPool(4096, 16),
        StatePool(64),
        policy,
        max_checkpoints=max_checkpoints,
        copy_block=lambda s, d: None,
        clock=clock,
    )


def _serve(cache: CacheManager, tokens: list[int]) -> int:
    """Admit, 'prefill' and finish one request; returns its hit depth."""
    seq = Sequence(str(id(tokens)), list(tokens), PARAMS)
    assert cache.admit(seq)
    hit = seq.num_computed_tokens
    assert cache.allocate(seq, seq.num_uncomputed)
    seq.num_computed_tokens = len(tokens)
    cache.release(seq, commit=True)
    cache.check_integrity([])
    return hit


def _burst_then_return(eviction: str) -> int:
    policy = Policy(
        "flashstate",
        cost=PrefillCost(1e-5, 1e-7),
        bytes_per_block=16_000,
        bytes_per_slot=60_000,
        eviction=eviction,
        frontier=True,
    )
    now = [0.0]
    cache = _manager(policy, max_checkpoints=8, clock=lambda: now[0])
    rng = random.Random(2)
    long = [rng.randrange(1000) for _ in range(2000)]
    _serve(cache, long)
    for _ in range(20):  # a burst of short, cheap contexts
        now[0] += 1
        _serve(cache, [rng.randrange(1000) for _ in range(40)])
    now[0] += 1
    return _serve(cache, long + [1, 2, 3])


def test_long_expensive_context_survives_a_burst_under_gds_not_lru():
    assert _burst_then_return("gds") == 2000
    assert _burst_then_return("lru") == 0


def test_protected_frontier_survives_until_its_idle_time_passes():
    policy = Policy(
        "flashstate",
        cost=PrefillCost(1e-5, 1e-7),
        bytes_per_block=16_000,
        bytes_per_slot=60_000,
        eviction="gds",
        frontier=True,
        leaf_last=True,
        leaf_idle_seconds=60.0,
    )
    now = [0.0]
    cache = _manager(policy, max_checkpoints=4, clock=lambda: now[0])
    rng = random.Random(3)

    def valuable():
        _serve(cache, [rng.randrange(1000) for _ in range(600)])

    for _ in range(3):  # older, more valuable units, long idle by the time the session below runs
        valuable()
    now[0] = 100.0
    cheap = [rng.randrange(1000) for _ in range(30)]  # a session frontier, worth little per byte
    _serve(cache, cheap)
    for _ in range(3):  # pressure while the session's agent is in a tool call
        now[0] += 5
        valuable()
    assert cache.tree.match(cheap + [0]).depth == 30, "protected frontier was evicted"
    assert cache.stats.evictions["capacity_state"] == 3  # the old valuable units went instead
    now[0] = 200.0  # idle past the protection window: now it is the cheapest unit
    valuable()
    assert cache.tree.match(cheap + [0]).depth == 0


def _ten_short_sessions(shared: bool) -> int:
    """Ten 40-token sessions (3 blocks + a checkpoint each: 108 kB) in a 1.2 MB budget; returns how many
    the cache still holds at the end."""
    policy = Policy(
        "flashstate", cost=PrefillCost(1e-5, 1e-7), bytes_per_block=16_000, bytes_per_slot=60_000,
        eviction="gds", frontier=True,
    )  # fmt: skip
    budget = 1_200_000
    if shared:  # either pool could take the whole budget: only the charge binds
        blocks, slots, kw = budget // 16_000, budget // 60_000, {"byte_budget": budget}
    else:  # the fixed 25% state share: 5 checkpoint slots, the rest KV blocks
        blocks, slots, kw = budget * 3 // 4 // 16_000, 5, {}
    cache = CacheManager(
        BlockPool(blocks, 16), StatePool(1 + slots), policy, max_checkpoints=slots,
        copy_block=lambda s, d: None, **kw,
    )  # fmt: skip
    rng = random.Random(3)
    sessions = [[rng.randrange(1000) for _ in range(40)] for _ in range(10)]
    for tokens in sessions:
        _serve(cache, tokens)
    return sum(cache.tree.match(tokens + [7]).depth == 40 for tokens in sessions)


def test_a_shared_budget_gives_checkpoints_the_bytes_kv_does_not_need():
    assert _ten_short_sessions(shared=True) == 10
    assert _ten_short_sessions(shared=False) == 5
