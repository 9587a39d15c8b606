"""Penalties, logit bias, allowed ids, min_tokens, top logprobs, n > 1 branches and priority scheduling,
end to end on the tiny model. Exactness: what the engine samples equals a reference computed here by hand
in torch on the very logits the model produced (ModelRunner.on_logits)."""

from __future__ import annotations

import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.engine.llm_engine import LLMEngine
from flashstate.sampling_params import branch

COST = (1e-5, 1e-10)  # no calibration
PROMPT = [5, 17, 99, 3, 250, 41, 7, 7, 120, 64, 33, 8]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    with LLM(tiny_model_dir, max_num_batched_tokens=256, prefill_cost_coefficients=COST) as llm:
        yield llm


def run(engine: LLMEngine, prompt: list[int], params: SamplingParams, capture: bool = False):
    """The finished output, and with `capture` the raw logits [V] of each sampling step."""
    steps: list[torch.Tensor] = []
    rid = engine.add_request(prompt, params)
    if capture:
        engine.runner.on_logits = lambda ids, logits: steps.append(logits[ids.index(rid)].clone())
    try:
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished and out.request_id == rid:
                    final = out
    finally:
        engine.runner.on_logits = None
    return final, steps


def reference_adjust(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams):
    """vLLM's order, written out token by token: bias, then repetition, frequency and presence."""
    x = logits.double().clone()
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


# A bias of 10 makes token 42 the greedy choice; each penalty then pulls it back once it has been chosen.
@pytest.mark.parametrize(
    "penalties",
    [
        {"repetition_penalty": 3.0},
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 0.6, "frequency_penalty": 0.4, "presence_penalty": 1.5},
        {"repetition_penalty": 1.3, "presence_penalty": -2.0},
    ],
)
def test_greedy_with_penalties_equals_a_reference_by_hand(llm, penalties):
    p = SamplingParams(
        temperature=0, max_tokens=16, ignore_eos=True, logit_bias={42: 10.0, 7: -3.0}, **penalties
    )
    out, steps = run(llm.engine, PROMPT, p, capture=True)
    assert len(steps) == len(out.token_ids) == 16
    for k, (logits, token) in enumerate(zip(steps, out.token_ids, strict=True)):
        assert token == int(reference_adjust(logits, PROMPT, out.token_ids[:k], p).argmax())
    raw_choices = [int(logits.argmax()) for logits in steps]
    assert raw_choices != out.token_ids and 42 in out.token_ids  # the bias and penalties did act


def test_penalties_only_touch_their_own_rows(llm):
    """A penalised request beside a plain one: the plain one's tokens are what it gets alone."""
    engine = llm.engine
    plain = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    alone, _ = run(engine, PROMPT, plain)
    a = engine.add_request(PROMPT, plain)
    engine.add_request(PROMPT[::-1], SamplingParams(temperature=0, max_tokens=10, repetition_penalty=2.0))
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] = out
    assert outs[a].token_ids == alone.token_ids


def test_logit_bias_and_allowed_token_ids(llm):
    forced, _ = run(
        llm.engine, PROMPT, SamplingParams(temperature=0.8, seed=3, max_tokens=6, logit_bias={42: 100})
    )
    assert forced.token_ids == [42] * 6
    allowed = [10, 20, 30]
    out, _ = run(llm.engine, PROMPT, SamplingParams(seed=1, max_tokens=12, allowed_token_ids=allowed))
    assert set(out.token_ids) <= set(allowed)


def test_min_tokens_masks_stop_ids_until_reached(llm):
    # token 42 is forced by the bias but is a stop id: masked for the first 4 tokens, then it stops.
    p = SamplingParams(temperature=0, max_tokens=10, logit_bias={42: 100}, stop_token_ids=[42], min_tokens=4)
    out, _ = run(llm.engine, PROMPT, p)
    assert len(out.token_ids) == 5 and 42 not in out.token_ids[:4]
    assert out.finish_reason == "stop" and out.stop_reason == 42
    early, _ = run(
        llm.engine,
        PROMPT,
        SamplingParams(temperature=0, max_tokens=10, logit_bias={42: 100}, stop_token_ids=[42]),
    )
    assert early.token_ids == [42]


def test_top_logprobs_are_the_raw_logits_top_k(llm):
    p = SamplingParams(temperature=0.7, seed=5, max_tokens=6, logprobs=5, repetition_penalty=1.5)
    out, steps = run(llm.engine, PROMPT, p, capture=True)
    assert len(out.top_logprobs) == len(out.logprobs) == len(out.token_ids) == 6
    for logits, token, lp, top in zip(steps, out.token_ids, out.logprobs, out.top_logprobs, strict=True):
        raw = torch.log_softmax(logits.float(), dim=-1)  # vLLM's default logprobs mode: raw logprobs
        assert lp == pytest.approx(float(raw[token]), abs=1e-5)
        values, ids = raw.topk(5)
        assert [t for t, _ in top] == ids.tolist()
        assert [v for _, v in top] == pytest.approx(values.tolist(), abs=1e-5)


def test_bounds_against_the_model(llm):
    engine = llm.engine
    vocab = engine.spec.vocab_size
    with pytest.raises(ValueError, match="^logprobs must be at most 20"):
        engine.add_request(PROMPT, SamplingParams(logprobs=21))
    with pytest.raises(ValueError, match="^logit_bias token ids"):
        engine.add_request(PROMPT, SamplingParams(logit_bias={vocab: 1.0}))
    with pytest.raises(ValueError, match="^allowed_token_ids"):
        engine.add_request(PROMPT, SamplingParams(allowed_token_ids=[vocab]))
    with pytest.raises(ValueError, match="^priority must be 0"):
        engine.add_request(PROMPT, SamplingParams(), priority=1)
    with pytest.raises(ValueError, match="^n must be 1 per engine request"):
        engine.add_request(PROMPT, SamplingParams(n=2))
    assert not engine.has_unfinished()


def _branches(engine: LLMEngine, prompt: list[int], params: SamplingParams, n: int, tag: str) -> list:
    """An n > 1 request as the server makes it: branch 0, then the others forked from it."""
    ids = [engine.add_request(prompt, branch(params, 0), f"{tag}-0")]
    ids += [engine.add_request(prompt, branch(params, i), f"{tag}-{i}", fork_of=ids[0]) for i in range(1, n)]
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] = out
    return [outs[i] for i in ids]


def test_branches_share_one_prefill_and_equal_each_seed_alone(llm):
    engine = llm.engine
    prompt = list(range(3, 90))
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=10, ignore_eos=True)
    engine.reset_prefix_cache()
    outs = _branches(engine, prompt, params, 3, "fork")
    # the first branch prefilled the prompt; the others resumed from its checkpoint at the last token but one
    assert outs[0].num_cached_tokens == 0
    assert [o.num_cached_tokens for o in outs[1:]] == [len(prompt) - 1] * 2
    for i, out in enumerate(outs):
        engine.reset_prefix_cache()
        alone, _ = run(
            engine, prompt, SamplingParams(temperature=1.0, seed=11 + i, max_tokens=10, ignore_eos=True)
        )
        assert out.token_ids == alone.token_ids, i
    assert len({tuple(o.token_ids) for o in outs}) > 1  # different seeds, different samples
    greedy = _branches(engine, prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), 2, "g")
    assert greedy[0].token_ids == greedy[1].token_ids
    engine.check_integrity()


def test_a_branch_aborted_while_it_waits_for_the_prefill(llm):
    engine = llm.engine
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=3), "w-0")
    engine.add_request(PROMPT, SamplingParams(max_tokens=3), "w-1", fork_of=first)
    assert engine.abort("w-1").finish_reason == "abort"
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()


def test_priority_orders_the_waiting_queue(tiny_model_dir):
    with LLM(
        tiny_model_dir, scheduling_policy="priority", max_num_seqs=1, prefill_cost_coefficients=COST
    ) as llm:
        engine = llm.engine
        p = SamplingParams(temperature=0, max_tokens=2)
        for rid, priority in (("late", 5), ("first", -1), ("mid", 3), ("mid2", 3)):
            engine.add_request(PROMPT, p, rid, priority=priority)
        order = []
        while engine.has_unfinished():
            order += [o.request_id for o in engine.step() if o.finished]
        assert order == ["first", "mid", "mid2", "late"]
