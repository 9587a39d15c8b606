"""Working slots under flashstate's shared budget: charged while a request holds one, so the memory of the
idle ones holds KV blocks and checkpoints; reserved apart (--reserve-working-slots, the engine before
2026-12-05) they hold nothing else. A request's admission evicts units for its slot, never its own hit, and
memory admission counts the slot in the request's footprint."""

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.cost import PrefillCost
from flashstate.cache.manager import CacheManager
from flashstate.cache.policy import Policy
from flashstate.cache.state_pool import StatePool
from flashstate.engine.admission import MemoryAdmission
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import Sequence

BLOCK, BLOCK_BYTES, SLOT_BYTES = 4, 64, 256  # a slot costs 4 blocks
MAX_NUM_SEQS = 4
PARAMS = SamplingParams(max_tokens=4)


def _cache(charged: bool) -> CacheManager:
    """The plans memory_plan makes of a budget of 4 working slots and 16 blocks: charged, each pool
    over-provisioned to the whole budget; reserved, the 16 blocks' worth shared beside the 4 slots."""
    budget = MAX_NUM_SEQS * SLOT_BYTES + 16 * BLOCK_BYTES
    shared = budget if charged else 16 * BLOCK_BYTES
    policy = Policy("flashstate", eviction="gds", frontier=True, cost=PrefillCost(1e-5, 1e-7),
                    bytes_per_block=BLOCK_BYTES, bytes_per_slot=SLOT_BYTES)  # fmt: skip
    return CacheManager(
        BlockPool(shared // BLOCK_BYTES, BLOCK),
        StatePool(shared // SLOT_BYTES + (0 if charged else MAX_NUM_SEQS)),
        policy,
        max_checkpoints=shared // SLOT_BYTES,
        copy_block=lambda src, dst: None,
        byte_budget=shared,
        working_charged=charged,
    )


def _serve(cache: CacheManager, tokens: list[int], rid: str) -> Sequence:
    """Admit, prefill and finish one request alone (its end kept as a checkpoint)."""
    seq = Sequence(rid, list(tokens), PARAMS)
    assert cache.admit(seq)
    cache.record_admission(seq)
    assert cache.allocate(seq, seq.num_uncomputed)
    seq.num_computed_tokens = len(seq.token_ids)
    cache.release(seq, commit=True)
    cache.check_integrity([])
    return seq


def test_the_idle_working_slots_memory_holds_checkpoints_when_charged():
    kept = {}
    for charged in (True, False):
        cache = _cache(charged)
        for i in range(8):  # eight sessions' first turns, one at a time: each leaves a 2-block checkpoint
            _serve(cache, [10 * i + j for j in range(7)], str(i))
        assert cache.charged_bytes <= cache.byte_budget
        kept[charged] = cache.num_checkpoints
    # one request runs at a time: charged, 4 + 16 blocks' worth less its slot holds 5 checkpoints of 6
    # blocks' worth each (hence 3 more); reserved, the 16 blocks hold 2
    assert kept == {True: 5, False: 2}


def test_a_requests_slot_evicts_other_units_never_its_own_hit():
    cache = _cache(charged=True)
    prompts = [[10 * i + j for j in range(7)] for i in range(5)]
    for i, tokens in enumerate(prompts):
        _serve(cache, tokens, str(i))
    assert cache.num_checkpoints == 5  # the budget is full: a new slot must evict a unit
    seq = Sequence("next", prompts[0] + [99, 98], PARAMS)  # resumes from the oldest, cheapest-to-lose one
    assert cache.admit(seq)
    assert seq.num_computed_tokens == 7 and cache.num_checkpoints == 4
    assert cache.charged_bytes <= cache.byte_budget
    cache.check_integrity([seq])


def test_memory_admission_counts_a_requests_slot_in_its_footprint():
    admission = MemoryAdmission(expected_output_tokens=4, cache_reserve=0.25, max_wait_seconds=5.0,
                                max_model_len=1000)  # fmt: skip
    seq = Sequence("s", list(range(12)), PARAMS)  # 12 + 4 tokens: 4 blocks
    charged, reserved = _cache(charged=True), _cache(charged=False)
    assert charged.slot_blocks == SLOT_BYTES // BLOCK_BYTES and reserved.slot_blocks == 0
    assert admission.footprint(reserved, seq) == 4
    assert admission.footprint(charged, seq) == 4 + 4
    # the running set's share is of the whole budget when charged: 4 slots' and 16 blocks' worth
    assert charged.kv_capacity_blocks == 32 and reserved.kv_capacity_blocks == 16
    # one request alone has the budget less its slot for its blocks
    assert charged.max_seq_blocks == 28 and reserved.max_seq_blocks == 16
