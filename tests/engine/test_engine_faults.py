"""No request kills the engine: context limits, bounds on request fields, a step that raises (the request
that caused it fails alone, the others finish as if nothing happened), and admission that never leaves a
request at the head of the queue."""

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashstate import LLM, SamplingParams
from flashstate.engine.llm_engine import MAX_FAULTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
COST = {"prefill_cost_coefficients": (1e-5, 1e-10)}  # no calibration: these tests build many engines
# a budget of its own for each engine, as two live side by side (on a GPU the default takes 90% of it)
PAIR = {**COST, "kv_cache_memory_bytes": 64 << 20, "async_scheduling": False}


def _assert_idle(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.requests
    engine.check_integrity()
    engine.reset_prefix_cache()
    assert engine.cache.block_pool.num_free == engine.cache.block_pool.num_blocks
    assert engine.cache.state_pool.num_free == engine.cache.state_pool.num_slots


@pytest.mark.parametrize("max_model_len", [64, 80, 100])
def test_no_max_tokens_runs_to_the_context_limit_and_ends_with_length(tiny_model_dir, max_model_len):
    llm = LLM(tiny_model_dir, **COST, max_model_len=max_model_len)
    prompt = list(range(5, 11))
    (out,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))
    assert out.finish_reason == "length"
    assert len(prompt) + len(out.token_ids) == max_model_len
    _assert_idle(llm)


def test_no_max_tokens_stops_at_what_the_kv_cache_holds(tiny_model_dir):
    llm = LLM(
        tiny_model_dir,
        **COST,
        max_model_len=4096,
        kv_cache_memory_bytes=400_000,  # 4 working states and 20 blocks: one request alone has 41 blocks
        block_size=16,
        max_num_seqs=4,
    )
    limit = llm.engine.context_limit
    assert limit < 4096
    (out,) = llm.generate([3, 4, 5], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))
    assert (out.finish_reason, 3 + len(out.token_ids)) == ("length", limit)


def test_fields_out_of_range_are_refused_or_neutral(tiny_model_dir):
    llm = LLM(tiny_model_dir, **COST)
    vocab = llm.engine.spec.vocab_size
    for ids in ([2**63], [10**20], [vocab]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            llm.generate([1, 2, 3], SamplingParams(max_tokens=2, stop_token_ids=ids))
    (plain,) = llm.generate([1, 2, 3], GREEDY)
    for top_k in (vocab, 2**63, 10**30):
        (out,) = llm.generate(
            [1, 2, 3], SamplingParams(temperature=0, top_k=top_k, max_tokens=10, ignore_eos=True)
        )
        assert out.token_ids == plain.token_ids
    (sampled,) = llm.generate(
        [1, 2, 3], SamplingParams(temperature=1.0, top_k=2**63, seed=2**64 - 1, max_tokens=4)
    )
    assert sampled.finished
    _assert_idle(llm)


def _poison(llm: LLM, marker: int, when=lambda seqs: True):
    """Every model step whose batch holds a request whose prompt starts with `marker` raises (as a kernel
    fault on one request's inputs would)."""
    runner = llm.engine.runner
    run = runner.run

    def faulty(batch, *args, **kwargs):
        if any(s.token_ids[0] == marker for s in batch.seqs) and when(batch.seqs):
            raise RuntimeError("injected fault")
        return run(batch, *args, **kwargs)

    runner.run = faulty


def test_a_step_that_raises_fails_only_the_request_that_causes_it(tiny_model_dir):
    clean = LLM(tiny_model_dir, **PAIR)
    prompts = [[11 + i] * (5 + 7 * i) for i in range(4)]
    expected = [o.token_ids for o in clean.generate(prompts, GREEDY)]

    llm = LLM(tiny_model_dir, **PAIR)
    _poison(llm, marker=999)
    outs = llm.generate([*prompts[:2], [999, 1, 2, 3], *prompts[2:]], GREEDY)
    assert outs[2].finish_reason == "error" and "injected fault" in outs[2].error
    assert [o.token_ids for o in outs[:2] + outs[3:]] == expected
    assert all(o.finish_reason == "length" and o.error is None for o in outs[:2] + outs[3:])
    _assert_idle(llm)
    # the engine goes on serving, with the cache
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected


def test_a_fault_late_in_a_request_fails_it_alone_after_its_batch_mates_are_cleared(tiny_model_dir):
    clean = LLM(tiny_model_dir, **PAIR)
    prompts = [[21 + i] * (6 + 3 * i) for i in range(3)]
    expected = [o.token_ids for o in clean.generate(prompts, GREEDY)]

    llm = LLM(tiny_model_dir, **PAIR)
    # the poisoned request decodes fine for a while, then every step that reaches its 5th output raises
    _poison(
        llm,
        marker=777,
        when=lambda seqs: any(s.token_ids[0] == 777 and len(s.output_token_ids) >= 5 for s in seqs),
    )
    outs = llm.generate([*prompts, [777, 5, 6]], GREEDY)
    assert outs[3].finish_reason == "error"
    assert [o.token_ids for o in outs[:3]] == expected
    assert all(o.error is None for o in outs[:3])
    _assert_idle(llm)


def test_a_request_in_max_faults_failed_steps_fails(tiny_model_dir):
    llm = LLM(tiny_model_dir, **PAIR)
    runner = llm.engine.runner
    run, calls = runner.run, []

    def flaky(batch, *args, **kwargs):  # fails whenever two or more run together: each alone succeeds
        calls.append(len(batch.seqs))
        if len(batch.seqs) > 1:
            raise RuntimeError("injected fault")
        return run(batch, *args, **kwargs)

    runner.run = flaky
    outs = llm.generate([[5, 6, 7], [8, 9, 10]], GREEDY)
    assert all(o.finished for o in outs)
    assert all(o.finish_reason in ("length", "error") for o in outs)
    assert sum(c > 1 for c in calls) <= MAX_FAULTS
    _assert_idle(llm)


def test_a_fault_before_a_batch_is_chosen_is_not_a_requests(tiny_model_dir):
    llm = LLM(tiny_model_dir, **COST)
    llm.engine.add_request([1, 2, 3], GREEDY)

    def broken():
        raise RuntimeError("scheduler fault")

    llm.engine.scheduler.schedule = broken
    with pytest.raises(RuntimeError, match="scheduler fault"):
        try:
            llm.engine.step()
        except RuntimeError as e:
            llm.engine.recover(e)


def _chat(llm: LLM, n: int) -> tuple[list[int], list[int]]:
    tok = llm.tokenizer
    msgs = [{"role": ("user", "assistant")[i % 2], "content": f"message {i} hello"} for i in range(n)]
    msgs.append({"role": "user", "content": "go"})
    text = tok.apply_chat_template(msgs, None, True)
    return tok.encode(text, add_special_tokens=False), tok.chat_message_boundaries(msgs, None, True)


def test_a_hit_that_locks_the_budget_is_admitted_as_a_miss_not_left_at_the_queue_head(tiny_model_dir):
    """The demo's 8M budget: a chat of 250 messages leaves checkpoints along its path; the next turn of 500
    messages hits that path, which locks them, and the rest of the budget cannot hold its blocks."""
    llm = LLM(tiny_model_dir, **COST, kv_cache_memory_bytes=8 << 20)
    engine = llm.engine
    for n in (250, 500):
        ids, positions = _chat(llm, n)
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=8), checkpoint_positions=positions)
        for _ in range(500):
            if not engine.has_unfinished():
                break
            engine.step()
        assert not engine.has_unfinished(), f"the {n}-message chat was never admitted"
    _assert_idle(llm)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 300), st.integers(1, 40), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["flashstate", "vllm", "sglang"]),
)
def test_every_admitted_workload_drains(tiny_model_dir, requests, policy):
    """Requests that share prefixes (family f), with checkpoint hints, under a budget of a few long prompts:
    every one finishes (by length, or refused with an error) in a bounded number of steps."""
    llm = LLM(
        tiny_model_dir,
        **COST, kv_cache_memory_bytes=4 << 20, block_size=16, max_num_batched_tokens=256,
        max_num_seqs=4, cache_policy=policy,
    )  # fmt: skip
    engine = llm.engine
    ids = []
    for family, length, max_tokens, hints in requests:
        prompt = [(family * 131 + i) % 2000 + 1 for i in range(length)]
        positions = list(range(16, length, 37)) if hints else None
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        with contextlib.suppress(ValueError):  # can never fit: refused on add
            ids.append(engine.add_request(prompt, params, checkpoint_positions=positions))
    finished = {}
    for _ in range(2000):
        if not engine.has_unfinished():
            break
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(finished) == set(ids)
    assert all(o.finish_reason in ("length", "error") for o in finished.values())
    _assert_idle(llm)
