"""Fuzzing the offline engine with hypothesis: any SamplingParams fields (extreme ints and floats, NaN and
infinities, stop strings and ids, seeds, max_tokens None) × prompts of any length (empty, at and past the
context, text or token ids, ids outside the vocabulary) × three engines (short contexts, and a KV cache
smaller than max_model_len, so requests are preempted and refused as too large for the whole cache).

A case is one to three requests run together. Each request either raises ValueError when built or added, or
finishes ("stop" or "length", within its max_tokens and the context limit); the engine never raises
anything else. After each case the engine's integrity check passes and, once the prefix cache is reset,
every block and state slot is free.

ENGINE_FUZZ_EXAMPLES (default 40) bounds it for CI; ENGINE_FUZZ_SEED (default 0) picks the cases."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

from flashstate import LLM, SamplingParams

EXAMPLES = int(os.environ.get("ENGINE_FUZZ_EXAMPLES", "40"))
SEED = int(os.environ.get("ENGINE_FUZZ_SEED", "0"))
COST = (1e-5, 1e-10)  # no calibration
VOCAB = 2048  # the embedded tiny model's
# name → engine arguments; "tight" has 2 KV blocks (32 tokens) under a max_model_len of 64 beside its 2
# reserved working states; "shared" charges its working states to its budget: one request alone has the
# room of 64 tokens and more, two running at once share one block beside their states
ENGINES = {
    "len16": {"max_model_len": 16, "kv_cache_memory_bytes": 4 << 20, "max_num_seqs": 4},
    "len48": {"max_model_len": 48, "kv_cache_memory_bytes": 4 << 20, "max_num_seqs": 4},
    "tight": {"max_model_len": 64, "kv_cache_memory_bytes": 140_000, "max_num_seqs": 2,
              "reserve_working_slots": True},
    "shared": {"max_model_len": 64, "kv_cache_memory_bytes": 130_000, "max_num_seqs": 2},
}  # fmt: skip
MAX_STEPS = 20_000  # far past any case's need: reaching it means the engine stopped making progress

_engines: dict[str, LLM] = {}


def _engine(name: str) -> LLM:
    if name not in _engines:
        _engines[name] = LLM(prefill_cost_coefficients=COST, **ENGINES[name])
    return _engines[name]


@pytest.fixture(scope="module", autouse=True)
def _close_engines():
    yield
    for llm in _engines.values():
        llm.close()
    _engines.clear()


BIG_INTS = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -(2**63), -(2**63) - 1, -(10**30)]
ints = st.one_of(st.integers(-3, 70), st.integers(), st.sampled_from(BIG_INTS))
floats = st.one_of(
    st.floats(0, 2),
    st.floats(),  # NaN, ±inf, ±0.0, subnormals, ±1.8e308
    st.sampled_from([1e-5, 1.0000001e-5, 9.99e-6, 2e-5, 1e-300, 5e-324, 1e300]),
    st.integers(-2, 2),
    st.sampled_from([10**400, True]),
)
stop_strings = st.text(max_size=4)
# Every field anywhere in its type's range, or past it ("wild"): mostly refused as a whole request.
WILD = {
    "n": st.one_of(st.just(1), ints),
    "temperature": st.one_of(st.just(0.0), floats),
    "top_p": floats,
    "top_k": st.one_of(st.none(), ints, st.sampled_from([VOCAB - 1, VOCAB, VOCAB + 1])),
    "min_p": floats,
    "seed": st.one_of(st.none(), ints),
    "max_tokens": st.one_of(st.none(), st.integers(-1, 40), ints),
    "stop": st.one_of(
        st.none(), stop_strings, st.lists(stop_strings, max_size=4), st.lists(st.just("a"), max_size=70)
    ),
    "stop_token_ids": st.one_of(
        st.none(),
        st.lists(st.integers(0, VOCAB - 1), max_size=8),
        st.lists(st.one_of(st.integers(-2, VOCAB + 2), st.sampled_from(BIG_INTS)), max_size=4),
    ),
    "ignore_eos": st.one_of(st.booleans(), st.just(1)),
    "logprobs": st.one_of(st.none(), st.integers(-1, 25), st.sampled_from([VOCAB, VOCAB + 1, 2**63])),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
}
# Every field within its bounds, extremes included: these requests reach the engine.
VALID = {
    "temperature": st.one_of(
        st.just(0.0), st.floats(0, 2), st.sampled_from([1e-5, 1.0000001e-5, 2e-5, 1e-300, 1e300, 1.7e308])
    ),
    "top_p": st.one_of(st.floats(0, 1, exclude_min=True), st.sampled_from([5e-324, 1e-300, 1.0])),
    "top_k": st.one_of(
        st.none(), st.integers(-1, 3), st.integers(0, 2**64), st.sampled_from([VOCAB - 1, VOCAB])
    ),
    "min_p": st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 5e-324])),
    "seed": st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.sampled_from([-(2**63), 2**64 - 1])),
    "max_tokens": st.one_of(st.none(), st.integers(1, 40)),
    "stop": st.one_of(st.none(), st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1, max_size=4))),
    "stop_token_ids": st.one_of(st.none(), st.lists(st.integers(0, VOCAB - 1), max_size=8)),
    "ignore_eos": st.booleans(),
    "logprobs": st.one_of(st.none(), st.integers(0, 25), st.just(VOCAB)),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
}
PARAMS = st.one_of(  # two valid requests for each wild one
    st.fixed_dictionaries({}, optional=VALID),
    st.fixed_dictionaries({}, optional=VALID),
    st.fixed_dictionaries({}, optional=WILD),
)
BAD_IDS = [-1, VOCAB, VOCAB + 1, 2**63, -(2**63)]


@st.composite
def prompts(draw, max_model_len: int):
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=3 * max_model_len))
    edges = [0, 1, 2, max_model_len - 1, max_model_len, max_model_len + 1, 2 * max_model_len]
    length = draw(st.one_of(st.sampled_from(edges), st.integers(0, max_model_len + 4)))
    ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=length, max_size=length))
    if ids and draw(st.integers(0, 9)) == 0:
        ids[draw(st.integers(0, len(ids) - 1))] = draw(st.sampled_from(BAD_IDS))
    return ids


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(ENGINES)))
    max_model_len = ENGINES[name]["max_model_len"]
    requests = draw(
        st.lists(
            st.tuples(prompts(max_model_len), PARAMS),
            min_size=1,
            max_size=3,
        )
    )
    return name, requests


def _run(name: str, requests: list) -> None:
    engine = _engine(name).engine
    added: dict[str, tuple[int, SamplingParams]] = {}
    for prompt, fields in requests:
        try:
            params = SamplingParams(**fields)
            request_id = engine.add_request(prompt, params)
        except ValueError:
            event("refused")
            continue
        added[request_id] = (engine.requests[request_id].seq.num_prompt_tokens, params)
    finished = {}
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    else:
        raise AssertionError(f"the engine made no end of {len(added)} request(s) in {MAX_STEPS} steps")
    assert set(finished) == set(added)
    for request_id, out in finished.items():
        num_prompt, params = added[request_id]
        assert out.finish_reason in ("stop", "length"), (out.finish_reason, out.error)
        event(f"finished: {out.finish_reason}")
        assert 1 <= len(out.token_ids) <= (params.max_tokens or engine.context_limit)
        assert num_prompt + len(out.token_ids) <= engine.context_limit
        if params.logprobs is not None:
            assert len(out.logprobs) == len(out.token_ids)
    engine.check_integrity()
    engine.reset_prefix_cache()
    engine.check_integrity()
    cache = engine.cache
    assert cache.block_pool.num_free == cache.block_pool.num_blocks
    assert cache.state_pool.num_free == cache.state_pool.num_slots


@given(cases())
@settings(max_examples=EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@seed(SEED)
def test_a_request_is_refused_or_finishes_and_the_pools_come_back_whole(case):
    _run(*case)


def test_the_engines_have_the_limits_the_cases_aim_at():
    assert _engine("len16").engine.context_limit == 16
    assert _engine("len48").engine.context_limit == 48
    tight = _engine("tight").engine
    assert tight.context_limit < ENGINES["tight"]["max_model_len"]
    shared = _engine("shared").engine
    plan, budget = shared.plan, ENGINES["shared"]["kv_cache_memory_bytes"]
    assert plan.working_charged and shared.context_limit == ENGINES["shared"]["max_model_len"]
    assert (budget - 2 * plan.bytes_per_slot) // plan.bytes_per_block == 1
