"""Async scheduling (a decode step launched before the previous one's tokens are read) changes nothing in
what requests get: tokens, text and finish reasons equal the synchronous engine's (logprobs to float
rounding), and every block
and slot comes back — with requests stopping on stop ids and eos mid-flight, at max_tokens, aborted while a
step for them is in flight, and more requests than max_num_seqs."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from flashstate import LLM, SamplingParams

COST = (1e-6, 1e-12)


def _requests(vocab: int, n: int = 10) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 40))]
        kind = i % 4
        if kind == 0:
            p = SamplingParams(temperature=0, max_tokens=rng.randint(3, 30), ignore_eos=True)
        elif kind == 1:  # a stop id comes at a data-dependent step
            p = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=list(range(0, vocab, 7)))
        elif kind == 2:
            p = SamplingParams(temperature=0, max_tokens=25, logprobs=0)
        else:
            p = SamplingParams(
                temperature=0.8, seed=i, max_tokens=20, stop_token_ids=list(range(0, vocab, 11))
            )
        out.append((prompt, p))
    return out


def _engine(model_dir: str, async_scheduling: bool, **kw) -> LLM:
    # an explicit budget: on a GPU the automatic one would give the first engine 90% of it
    args = dict(
        max_num_seqs=4,
        max_num_batched_tokens=64,
        prefill_cost_coefficients=COST,
        kv_cache_memory_bytes=512 << 20,
    )
    args.update(kw)
    return LLM(model_dir, async_scheduling=async_scheduling, **args)


def _summary(outs) -> list:
    return [(o.token_ids, o.text, o.finish_reason, o.stop_reason, o.logprobs) for o in outs]


def _assert_same(got: list, want: list) -> None:
    """Exactly the same tokens, text and finish; logprobs to float rounding (a step launched ahead may carry
    rows of requests that just stopped, and batch shape can move the last bit)."""
    assert [r[:4] for r in got] == [r[:4] for r in want]
    for g, w in zip(got, want, strict=True):
        assert (g[4] is None) == (w[4] is None)
        if g[4] is not None:
            assert g[4] == pytest.approx(w[4], rel=1e-4, abs=1e-5)  # GPU kernels differ by shape


def _assert_pools_full(llm: LLM) -> None:
    engine = llm.engine
    engine.check_integrity()
    engine.reset_prefix_cache()
    assert engine.cache.block_pool.num_free == engine.cache.block_pool.num_blocks
    assert engine.cache.state_pool.num_free == engine.cache.state_pool.num_slots


@pytest.mark.parametrize(
    ("prefix_caching", "policy"), [(True, "flashstate"), (False, "flashstate"), (True, "vllm")]
)
def test_outputs_equal_the_synchronous_engine(tiny_model_dir, prefix_caching, policy):
    results, ahead, hits = {}, {}, {}
    for mode in (False, True):
        llm = _engine(tiny_model_dir, mode, enable_prefix_caching=prefix_caching, cache_policy=policy)
        # one shared 70-token system prompt: more than one of vLLM's 64-token blocks, so every policy hits
        reqs = [(list(range(100, 170)) + p, sp) for p, sp in _requests(llm.engine.spec.vocab_size)]
        calls = []
        launch = llm.engine.runner.launch_ahead
        llm.engine.runner.launch_ahead = lambda *a, _f=launch, _c=calls: _c.append(1) or _f(*a)
        first = llm.generate([p for p, _ in reqs], [s for _, s in reqs])
        # a second turn each, resuming from the frontier checkpoint the first one left (a prefix hit)
        turns = [p + o.token_ids + [7, 8, 9] for (p, _), o in zip(reqs, first, strict=True)]
        results[mode] = [_summary(first), _summary(llm.generate(turns, [s for _, s in reqs]))]
        ahead[mode] = len(calls)
        hits[mode] = llm.engine.cache.stats.cached_tokens
        _assert_pools_full(llm)
    assert ahead[False] == 0 and ahead[True] > 20
    assert hits[True] == hits[False] and (hits[True] > 0) == prefix_caching  # the same cache decisions
    for got, want in zip(results[True], results[False], strict=True):
        _assert_same(got, want)
    reasons = {r[2] for r in results[True][0]}
    assert reasons == {"stop", "length"}


def test_abort_while_a_step_for_the_request_is_in_flight(tiny_model_dir):
    llm = _engine(tiny_model_dir, True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ids = [engine.add_request([3 + i, 9, 27, 81 % 50, 11], params) for i in range(3)]
    outs: dict[str, list] = {i: [] for i in ids}
    aborted = False
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id].append(o)
        if not aborted and len(outs[ids[1]]) >= 5:
            assert engine._in_flight is not None  # a step with ids[1] in it is on the device
            engine.abort(ids[1])
            aborted = True
    assert aborted and outs[ids[1]][-1].finish_reason != "length"
    sync = _engine(tiny_model_dir, False)
    want = sync.generate([[3 + i, 9, 27, 81 % 50, 11] for i in (0, 2)], params)
    assert [outs[ids[0]][-1].token_ids, outs[ids[2]][-1].token_ids] == [o.token_ids for o in want]
    _assert_pools_full(llm)


def test_a_fetched_host_restore_stops_the_decode_pipeline(tiny_model_dir):
    """Decode steps launched ahead skip `schedule()`, which is what moves a restored sequence to running: once
    a restore's fetch is done the engine reads the step in flight and schedules, instead of launching on."""
    llm = _engine(tiny_model_dir, True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i in range(2):
        engine.add_request([3 + i, 9, 27, 11], params)
    while engine._in_flight is None:
        engine.step()
    fetched = [False]
    restoring = SimpleNamespace(restore=SimpleNamespace(ready=lambda: fetched[0]))
    engine.scheduler.restoring.append(restoring)  # stands for a sequence whose state is being fetched
    engine.step()
    assert engine._in_flight is not None  # still fetching: the pipeline goes on
    fetched[0] = True
    engine.step()
    assert engine._in_flight is None  # the step in flight was read; the next one is scheduled
    engine.scheduler.restoring.remove(restoring)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    want = _engine(tiny_model_dir, False).generate([[3 + i, 9, 27, 11] for i in range(2)], params)
    assert sorted(o.token_ids for o in outs) == sorted(o.token_ids for o in want)
    _assert_pools_full(llm)
