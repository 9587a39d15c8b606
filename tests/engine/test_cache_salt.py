"""Cache salts: requests share prefix-cache hits (GPU tree, vLLM's page pool, host tier) only with requests
of the same salt."""

import pytest

from flashstate import SamplingParams
from flashstate.config import EngineConfig
from flashstate.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = [(7 * i) % 1900 + 3 for i in range(200)]


def _run(engine: LLMEngine, prompt: list[int], salt: str | None) -> tuple[int, list[int]]:
    """(cached prompt tokens, output) of one request run to its end."""
    rid = engine.add_request(prompt, GREEDY, cache_salt=salt)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return out.num_cached_tokens, out.token_ids


@pytest.mark.parametrize("policy", ["flashstate", "vllm", "sglang"])
def test_hits_only_within_a_salt(tiny_model_dir, policy):
    engine = LLMEngine(
        EngineConfig(tiny_model_dir, cache_policy=policy, prefill_cost_coefficients=(1e-5, 1e-10))
    )
    cached, first = _run(engine, PROMPT, "tenant-a")
    assert cached == 0
    turn = PROMPT + first + [5, 6, 7]  # the next turn re-sends the first's prompt and output
    cached, expected = _run(engine, turn, "tenant-b")
    assert cached == 0  # another salt: nothing shared
    assert _run(engine, turn, None) == (0, expected)  # nor unsalted
    cached, out = _run(engine, turn, "tenant-a")
    assert cached > 0 and out == expected  # the same salt: a hit
    engine.check_integrity()
    engine.reset_prefix_cache()
    assert engine.cache.block_pool.num_free == engine.cache.block_pool.num_blocks
    assert set(engine.cache.tree.roots) == {None}  # a salt's root goes with its last path


def test_host_tier_restores_only_within_a_salt(tiny_model_dir):
    engine = LLMEngine(
        EngineConfig(
            tiny_model_dir,
            host_cache_bytes=64 << 20,
            host_chunk_tokens=32,
            prefill_cost_coefficients=(1e-5, 1e-10),
        )
    )
    _, first = _run(engine, PROMPT, "tenant-a")
    engine.host.flush()
    engine.reset_prefix_cache()  # the GPU cache forgets: only the host tier holds the state
    turn = PROMPT + first + [5, 6, 7]
    cached, expected = _run(engine, turn, "tenant-b")
    assert cached == 0
    engine.reset_prefix_cache()
    cached, out = _run(engine, turn, "tenant-a")
    assert cached > 0 and out == expected
    assert engine.host.stats.restores == 1
    engine.close()
