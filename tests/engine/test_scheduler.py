"""Scheduler rules on pools alone (no model): budgets, FIFO, mixed steps, preemption, refusal."""

import pytest

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.manager import CacheManager
from flashstate.cache.state_pool import StatePool
from flashstate.config import EngineConfig
from flashstate.engine.scheduler import RequestTooLargeError, Scheduler, prefill_order
from flashstate.sampling_params import SamplingParams
from flashstate.sequence import Sequence


def _scheduler(
    num_blocks=16, block_size=4, slots=8, max_num_seqs=4, budget=10, max_len=1000, long_prefill=0, **kw
):
    cache = CacheManager(BlockPool(num_blocks, block_size), StatePool(slots))
    return Scheduler(cache, max_num_seqs, budget, max_len, long_prefill, **kw)


def _seq(rid: str, n: int, max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(range(n)), SamplingParams(max_tokens=max_tokens))


def _advance(sched: Scheduler, batch, sampled: int = 7) -> None:
    """What the engine does after the model ran: computed lengths move, finished prompts get a token."""
    tokens = [sampled if batch.samples(i) else None for i in range(len(batch))]
    sched.update_from_output(batch, tokens, lambda i, seq, token: None)


def test_chunked_prefill_respects_budget_and_mixes_with_decodes():
    sched = _scheduler(budget=10)
    a, b = _seq("a", 3), _seq("b", 25)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "b"] and batch.num_tokens == [3, 7]
    assert batch.samples(0) and not batch.samples(1)
    _advance(sched, batch)
    batch = sched.schedule()  # a decodes (1 token) while b continues its prefill with the rest of the budget
    assert batch.num_tokens == [1, 9]
    sched.check_integrity()


def test_a_long_prefill_takes_at_most_the_threshold_and_leaves_the_rest_to_short_ones():
    sched = _scheduler(num_blocks=32, budget=16, long_prefill=6)
    long, short = _seq("long", 40), _seq("short", 5, max_tokens=20)
    sched.add(long)
    sched.add(short)
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["long", "short"] and batch.num_tokens == [6, 5]
    _advance(sched, batch)
    while long.num_uncomputed > 6:  # short decodes; long goes on 6 at a time, though budget is left
        batch = sched.schedule()
        assert batch.num_tokens == [6, 1]
        _advance(sched, batch)
    assert sched.schedule().num_tokens == [4, 1]  # under the threshold: the rest in one chunk
    sched.check_integrity()


@pytest.mark.parametrize("arrivals_first", [False, True])
def test_arrivals_first_admits_ahead_of_a_running_prefill_which_keeps_the_rest(arrivals_first):
    sched = _scheduler(num_blocks=32, budget=16, arrivals_first=arrivals_first)
    long, d = _seq("long", 60), _seq("d", 2, max_tokens=20)
    sched.add(d)
    sched.add(long)
    _advance(sched, sched.schedule())  # d prefilled (2), long's first chunk (14)
    short = _seq("short", 5)
    sched.add(short)
    batch = sched.schedule()
    if arrivals_first:  # d decodes, short is admitted, long takes what is left: the step stays full
        assert [s.request_id for s in batch.seqs] == ["d", "short", "long"] and batch.num_tokens == [1, 5, 10]
    else:  # vLLM's order: long's chunk fills the budget and short waits a step
        assert [s.request_id for s in batch.seqs] == ["d", "long"] and batch.num_tokens == [1, 15]
        assert list(sched.waiting) == [short]
    _advance(sched, batch)
    batch = sched.schedule()  # nothing waits: the running prefill goes in its FIFO place again
    assert batch.seqs[0].request_id == "d" and sum(batch.num_tokens) == 16
    sched.check_integrity()


def _long_then_short(num_blocks: int) -> tuple[Scheduler, list[list[tuple[str, int]]]]:
    """d decodes; long (30 tokens) is admitted, then short (12); arrivals-first, budget 8: the steps."""
    sched = _scheduler(num_blocks=num_blocks, block_size=4, budget=8, arrivals_first=True)
    sched.add(_seq("d", 3, max_tokens=30))
    sched.add(_seq("long", 30))
    steps = []
    for i in range(7):
        if i == 1:
            sched.add(_seq("short", 12))
        batch = sched.schedule()
        steps.append([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_tokens, strict=True)])
        _advance(sched, batch)
        sched.check_integrity()
    return sched, steps


def test_arrivals_first_gives_the_budget_to_the_shortest_running_prefill_first():
    _, steps = _long_then_short(num_blocks=16)
    assert steps[1] == [("d", 1), ("short", 7)]  # short admitted ahead of long's chunk
    # nothing waits: short (5 left) goes before long (23 left), which takes what remains
    assert steps[2] == [("d", 1), ("short", 5), ("long", 2)]
    assert steps[3] == [("d", 1), ("short", 1), ("long", 6)]


def test_a_prefill_short_of_blocks_preempts_one_not_yet_in_the_step():
    sched, steps = _long_then_short(num_blocks=14)
    # the decodes of d and short took the last blocks; long, ordered after short, yields its own
    assert steps[6] == [("d", 1), ("short", 1)]
    assert [s.request_id for s in sched.running] == ["d", "short"]
    assert [s.request_id for s in sched.waiting] == ["long"]
    assert sched.waiting[0].stats.num_preemptions == 1


def test_prefill_order_defaults_to_arrivals_first_for_flashstate_alone():
    assert prefill_order(EngineConfig(cache_policy="flashstate")) == "arrivals-first"
    assert prefill_order(EngineConfig(cache_policy="vllm")) == "fifo"
    assert (
        prefill_order(EngineConfig(cache_policy="vllm", prefill_order="arrivals-first")) == "arrivals-first"
    )
    with pytest.raises(ValueError, match="prefill_order must be one of"):
        EngineConfig(prefill_order="lifo")


def test_fifo_head_is_never_skipped():
    sched = _scheduler(num_blocks=6, block_size=4, budget=100)
    big, small = _seq("big", 20), _seq("small", 2)
    sched.add(_seq("first", 8))
    sched.add(big)
    sched.add(small)
    batch = sched.schedule()
    # "first" takes 2 blocks; "big" needs 5 of the 4 left and waits — "small" must not jump ahead of it.
    assert [s.request_id for s in batch.seqs] == ["first"]
    assert [s.request_id for s in sched.waiting] == ["big", "small"]
    sched.schedule()  # "big" is tried (and undone) again
    assert sched.cache.stats.queries == 1, "an undone admission must not count as a cache lookup"
    sched.check_integrity()


def test_preemption_frees_the_newest_and_requeues_it_first():
    sched = _scheduler(num_blocks=4, block_size=4, budget=100)
    a, b = _seq("a", 7), _seq("b", 7)
    sched.add(a)
    sched.add(b)
    _advance(sched, sched.schedule())  # both prefilled: 8 tokens each, 2 blocks each
    _advance(sched, sched.schedule())  # both decode token 8 (still inside their second block)
    assert len(a.block_table) == 2 and len(b.block_table) == 2
    batch = sched.schedule()  # a's next decode needs a third block: b (newest) is preempted
    assert [s.request_id for s in batch.seqs] == ["a"]
    assert list(sched.waiting) == [b] and b.num_computed_tokens == 0 and not b.block_table
    assert b.stats.num_preemptions == 1 and b.state_slot is None
    sched.check_integrity()


def test_admission_waits_until_the_whole_prompt_fits_beside_running_ones():
    sched = _scheduler(num_blocks=6, block_size=4, budget=4)
    a, b = _seq("a", 14), _seq("b", 9)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()  # a takes 4 blocks to its first token; b would need 3 more of the 2 left
    assert [s.request_id for s in batch.seqs] == ["a"] and list(sched.waiting) == [b]
    sched.check_integrity()


def test_max_num_seqs_and_slots_bound_admission():
    sched = _scheduler(slots=2, max_num_seqs=3, budget=100)
    for i in range(4):
        sched.add(_seq(str(i), 2))
    assert len(sched.schedule()) == 2  # only two state slots
    sched.check_integrity()


def test_refusals_are_immediate():
    sched = _scheduler(num_blocks=4, block_size=4, max_len=30)
    with pytest.raises(RequestTooLargeError, match="max_model_len"):
        sched.add(_seq("x", 28, max_tokens=4))
    with pytest.raises(RequestTooLargeError, match="whole KV cache"):
        sched.add(_seq("y", 16, max_tokens=4))
    assert not sched.waiting


def test_finish_from_any_state_releases_everything():
    sched = _scheduler(budget=5)
    a, b = _seq("a", 12), _seq("b", 3)
    sched.add(a)
    sched.add(b)
    _advance(sched, sched.schedule())
    sched.finish(a, "abort")  # mid-prefill
    sched.finish(b, "abort")  # still queued
    assert a.finish_reason == b.finish_reason == "abort"
    sched.check_integrity()
    assert sched.cache.block_pool.num_free == 16 and sched.cache.state_pool.num_free == 8
