"""Output text detokenised on read (TextStream): the same deltas, text and finish as a StopChecker fed in the
step loop, whichever outputs a consumer reads, in whatever order, from whichever thread."""

from __future__ import annotations

import queue
import random
import threading

import pytest

from flashstate import LLM, SamplingParams
from flashstate.engine.output.stop_checker import StopChecker


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(
        tiny_model_dir, max_num_batched_tokens=256, max_num_seqs=8, prefill_cost_coefficients=(1e-6, 1e-12)
    )


def _params(i: int, eos_ids: tuple[int, ...]) -> SamplingParams:
    kinds = [
        dict(max_tokens=24, ignore_eos=True),
        dict(max_tokens=40, stop_token_ids=list(range(100, 160))),  # a stop token id comes early
        dict(
            max_tokens=30, stop_token_ids=[eos_ids[0]] if eos_ids else None, include_stop_str_in_output=True
        ),
        dict(max_tokens=20, skip_special_tokens=False, ignore_eos=True),
        dict(max_tokens=25, stop=["e", "th"]),  # stop strings: detokenised in the step loop
    ]
    return SamplingParams(temperature=1.0, seed=i, **kinds[i % len(kinds)])


def _run(llm: LLM, n: int) -> tuple[dict[str, list], dict[str, SamplingParams], dict[str, list[int]]]:
    engine = llm.engine
    rng = random.Random(0)
    outputs: dict[str, list] = {}
    params: dict[str, SamplingParams] = {}
    prompts: dict[str, list[int]] = {}
    for i in range(n):
        prompt = [rng.randrange(engine.spec.vocab_size) for _ in range(rng.randint(3, 30))]
        p = _params(i, engine.eos_token_ids)
        rid = engine.add_request(prompt, p)
        outputs[rid], params[rid], prompts[rid] = [], p, prompt
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs, params, prompts


def _expected(llm: LLM, params: SamplingParams, prompt: list[int], outs: list) -> list[tuple[str, str]]:
    """What the step loop used to report: a StopChecker fed every token as it was generated."""
    tok = llm.engine.tokenizer
    checker = StopChecker(
        params, lambda ids: tok.decode(ids, skip_special_tokens=params.skip_special_tokens),
        llm.engine.eos_token_ids, prompt,
    )  # fmt: skip
    text, rows = "", []
    for out in outs:
        delta = "".join(checker.append(t) for t in out.delta_token_ids)
        text += delta
        rows.append((text, delta))
    assert checker.finished and checker.finish.reason == outs[-1].finish_reason
    assert checker.finish.stop_reason == outs[-1].stop_reason
    return rows


def test_deltas_read_in_order_equal_the_step_loop_checker(llm):
    outputs, params, prompts = _run(llm, 5)
    reasons = set()
    for rid, outs in outputs.items():
        want = _expected(llm, params[rid], prompts[rid], outs)
        assert [(o.text, o.delta_text) for o in outs] == want
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert outs[-1].token_ids == [t for o in outs for t in o.delta_token_ids]
        reasons.add((outs[-1].finish_reason, type(outs[-1].stop_reason).__name__))
    assert {("length", "NoneType"), ("stop", "int"), ("stop", "str")} <= reasons


def test_reading_only_the_last_output_or_out_of_order_gives_the_same_text(llm):
    outputs, params, prompts = _run(llm, 5)
    for rid, outs in outputs.items():
        want = _expected(llm, params[rid], prompts[rid], outs)
        assert outs[-1].text == want[-1][0]  # passes every earlier output
        middle = len(outs) // 2
        assert (outs[middle].text, outs[middle].delta_text) == want[middle]
        assert [o.delta_text for o in reversed(outs)] == [d for _, d in reversed(want)]


def test_outputs_read_on_another_thread_while_the_engine_steps(llm):
    engine = llm.engine
    rng = random.Random(1)
    rids = [
        engine.add_request(
            [rng.randrange(engine.spec.vocab_size) for _ in range(10)],
            SamplingParams(temperature=1.0, seed=i, max_tokens=20, ignore_eos=True),
        )
        for i in range(6)
    ]
    produced: queue.Queue = queue.Queue()
    read: dict[str, str] = {}

    def reader():
        while (out := produced.get()) is not None:
            read[out.request_id] = read.get(out.request_id, "") + out.delta_text

    thread = threading.Thread(target=reader)
    thread.start()
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            produced.put(out)
            if out.finished:
                finals[out.request_id] = out
    produced.put(None)
    thread.join(timeout=30)
    assert not thread.is_alive()
    for rid in rids:
        assert read[rid] == finals[rid].text
        assert finals[rid].finish_reason == "length" and len(finals[rid].token_ids) == 20


def test_abort_output_keeps_the_text_so_far(llm):
    engine = llm.engine
    rid = engine.add_request(
        [5, 6, 7, 8], SamplingParams(temperature=1.0, seed=3, max_tokens=50, ignore_eos=True)
    )
    seen = []
    for _ in range(6):
        seen += engine.step()
    out = engine.abort(rid)
    assert out.finished and out.finish_reason == "abort"
    assert out.delta_token_ids == [] and out.delta_text == ""
    assert out.text == "".join(o.delta_text for o in seen)
    assert out.token_ids == [t for o in seen for t in o.delta_token_ids]
