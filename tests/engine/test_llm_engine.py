"""The engine end to end on the tiny default model: batching, chunking, preemption, aborts, refusals."""

import random

import pytest

from flashstate import LLM, SamplingParams
from flashstate.cache.cache_tensors import kv_bytes_per_block, state_bytes_per_slot
from flashstate.engine.scheduler import RequestTooLargeError
from flashstate.spec.hf_config import spec_from_hf

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 70))] for _ in range(n)]


def _budget(model_dir: str, max_num_seqs: int, num_blocks: int, block_size: int) -> int:
    spec = spec_from_hf(model_dir)
    import torch

    return max_num_seqs * state_bytes_per_slot(spec, torch.float32) + num_blocks * kv_bytes_per_block(
        spec, block_size, torch.float32
    )


def _assert_pools_full(llm: LLM) -> None:
    engine = llm.engine
    engine.check_integrity()
    engine.reset_prefix_cache()
    engine.check_integrity()
    assert engine.cache.block_pool.num_free == engine.cache.block_pool.num_blocks
    assert engine.cache.state_pool.num_free == engine.cache.state_pool.num_slots


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_num_batched_tokens=4096)
    vocab = llm.engine.spec.vocab_size
    prompts = _prompts(8, vocab)
    return prompts, [llm.generate(p, GREEDY)[0].token_ids for p in prompts]


def test_batched_chunked_preempted_outputs_equal_each_request_alone(tiny_model_dir, alone):
    prompts, expected = alone
    block_size = 4
    llm = LLM(
        tiny_model_dir,
        max_num_batched_tokens=16,  # prompts up to 70 tokens: several chunks each
        max_num_seqs=6,
        block_size=block_size,
        enable_prefix_caching=False,
        memory_admission=False,  # all six admitted on their first chunks: their growth must preempt
        # 48 blocks = 192 tokens for 6 running sequences of up to 82 tokens: preemption must happen.
        kv_cache_memory_bytes=_budget(tiny_model_dir, 6, 48, block_size),
    )
    engine = llm.engine
    assert engine.cache.block_pool.num_blocks == 48
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    done, chunked = {}, set()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        for s in engine.scheduler.running:
            if 0 < s.num_computed_tokens < s.num_prompt_tokens:
                chunked.add(s.request_id)
        engine.check_integrity()
    preempted = [rid for rid in ids if done[rid].stats.num_preemptions > 0]
    assert preempted, "the tiny budget should force preemption"
    assert len(chunked) >= 3, "long prompts should be prefilled in several chunks"
    for rid, want in zip(ids, expected, strict=True):
        assert done[rid].token_ids == want, f"{rid} differs from its solo run"
    _assert_pools_full(llm)


@pytest.mark.parametrize("when", ["queued", "mid_prefill", "mid_decode"])
def test_abort_returns_every_block_and_slot(tiny_model_dir, when):
    llm = LLM(tiny_model_dir, max_num_batched_tokens=8, max_num_seqs=2, block_size=4)
    engine = llm.engine
    prompts = _prompts(4, engine.spec.vocab_size, seed=1)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    target = {"queued": ids[3], "mid_prefill": ids[0], "mid_decode": ids[0]}[when]
    seq = engine.requests[target].seq
    for _ in range(200):
        if when == "queued":
            break
        if when == "mid_prefill" and 0 < seq.num_computed_tokens < seq.num_prompt_tokens:
            break
        if when == "mid_decode" and len(seq.output_token_ids) >= 2:
            break
        engine.step()
    else:
        pytest.fail(f"never reached {when}")
    out = engine.abort(target)
    assert out.finished and out.finish_reason == "abort"
    engine.check_integrity()
    assert target not in engine.requests
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
    _assert_pools_full(llm)


def test_requests_that_can_never_run_are_refused_not_queued(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4)
    engine = llm.engine
    with pytest.raises(RequestTooLargeError, match="max_model_len"):
        engine.add_request(list(range(60)), SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([engine.spec.vocab_size + 5], GREEDY)
    small = LLM(
        tiny_model_dir, block_size=4, max_num_seqs=2, kv_cache_memory_bytes=_budget(tiny_model_dir, 1, 8, 4)
    )  # one request's working state and 8 blocks: a request needs its state beside its blocks
    with pytest.raises(RequestTooLargeError, match="whole KV cache"):
        small.engine.add_request(list(range(30)), SamplingParams(max_tokens=8))
    assert not engine.has_unfinished() and not small.engine.has_unfinished()


def test_bad_sampling_parameters_fail_at_submission():
    for kwargs, word in [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": 5}, "stop"),
    ]:
        with pytest.raises(ValueError, match=word):
            SamplingParams(**kwargs)


def test_generate_text_chat_stop_and_stats(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    out = llm.generate("def add(a, b):", SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.stats.num_prompt_tokens == len(out.prompt_token_ids) > 0
    assert out.stats.ttft is not None and out.stats.ttft > 0 and out.stats.prefill_seconds > 0
    chat = llm.chat(
        [{"role": "user", "content": "hello"}], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    )[0]
    rendered = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}])
    assert chat.prompt_token_ids == llm.tokenizer.encode(rendered, add_special_tokens=False)
    # A stop token id that greedy decoding is about to produce ends the request with that reason.
    first = llm.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))[
        0
    ].token_ids[0]
    stopped = llm.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[first]))[
        0
    ]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == first and stopped.token_ids == [first]
    _assert_pools_full(llm)


def test_seeded_sampling_is_reproducible_across_batches(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=10, ignore_eos=True)
    alone = llm.generate([5, 6, 7, 8], p)[0].token_ids
    mixed = llm.generate(
        [[5, 6, 7, 8], [9, 9, 9], [1, 2]],
        [p, SamplingParams(temperature=1.0, max_tokens=10), SamplingParams(temperature=0.7, max_tokens=3)],
    )
    assert mixed[0].token_ids == alone
