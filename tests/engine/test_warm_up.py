"""The GPU start-up warm-up (LLMEngine.warm_up), run here on the CPU."""

import pytest

from flashstate import LLM
from tests.engine.test_llm_engine import GREEDY, _prompts


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    prompts = _prompts(3, llm.engine.spec.vocab_size)
    return prompts, [llm.generate(p, GREEDY)[0].token_ids for p in prompts]


@pytest.mark.parametrize("policy", ["flashstate", "vllm"])
def test_a_warm_up_leaves_nothing_behind(tiny_model_dir, alone, policy):
    """The warm-up steps at every power-of-two size bucket up to the token
    budget, prefilling fresh and over a cached prefix; afterwards a fresh cache holds nothing, counts nothing,
    and the outputs are those of an engine that never warmed up."""
    prompts, want = alone
    llm = LLM(tiny_model_dir, max_num_batched_tokens=1024, cache_policy=policy)
    engine = llm.engine
    steps, run = [], engine.runner.run
    engine.runner.run = lambda batch, *a, **kw: steps.append(sum(batch.num_tokens)) or run(batch, *a, **kw)
    engine.warm_up()
    engine.runner.run = run
    assert {t.bit_length() - 1 for t in steps} == set(range(1, 11))  # 2-3, 4-7, ..., 1024: every bucket
    assert engine.cache.stats.queries == 10 * 4  # it did run requests through the cache (4 per size)...
    assert engine.cache.stats.cached_tokens > 0  # ...and hit it
    engine._new_cache()
    assert engine.cache.stats.queries == 0 and engine.cache.num_checkpoints == 0
    assert engine.cache.block_pool.num_free == engine.cache.block_pool.num_blocks
    assert [llm.generate(p, GREEDY)[0].token_ids for p in prompts] == want
    engine.check_integrity()


def test_a_warm_up_fits_a_cache_smaller_than_the_token_budget(tiny_model_dir):
    """A KV cache of 320 tokens beside a 2,048-token budget: the warm-up's requests stay within what the
    cache can ever hold (they were refused as too large, so such a server could not start on a GPU)."""
    llm = LLM(
        tiny_model_dir, max_model_len=4096, kv_cache_memory_bytes=400_000, max_num_seqs=4,
        prefill_cost_coefficients=(1e-5, 1e-10),
    )  # fmt: skip
    engine = llm.engine
    assert engine.context_limit < engine.config.max_num_batched_tokens
    engine.warm_up()
    engine.check_integrity()
    assert not engine.has_unfinished()
