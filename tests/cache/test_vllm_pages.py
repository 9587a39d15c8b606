"""The emulated vLLM page pool against real vLLM 0.32's traces (benchmarks/vllm_reference/results).

Offline: each prompt is built from the outputs vLLM itself generated (recorded in the result file), so
every prompt is the one vLLM saw; the pool must reproduce vLLM's per-request cached tokens, which blocks
and states it held along the prompt before and after each request, and its free-page and cache-key
counts, with ample memory and under eviction.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

import pytest

from flashstate.cache.vllm_pages import VllmPagePool

REF = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_reference"
sys.path.insert(0, str(REF))
from workload import PromptBuilder, load_spec  # noqa: E402

RUNS = ["ample", "evict_192blocks", "evict_128blocks", "evict_96blocks", "evict_64blocks", "evict_48blocks"]


def _field(row: dict, name: str):
    value = row[name]
    return ast.literal_eval(value) if isinstance(value, str) else value


@pytest.mark.parametrize("run", RUNS)
def test_pool_reproduces_vllm_trace(run: str) -> None:
    result = json.loads((REF / "results" / f"vllm_{run}.json").read_text())
    spec = load_spec(REF / "workload.json")
    pages = result["vllm_config"]["frontend_cache_config"]["num_gpu_blocks"]
    pool = VllmPagePool(pages, result["block_size"], num_state_groups=3)
    builder = PromptBuilder(spec)
    for req, row in zip(spec["requests"], result["requests"], strict=True):
        prompt = builder.build(req)
        digest = hashlib.sha256(json.dumps(prompt, separators=(",", ":")).encode()).hexdigest()[:16]
        assert digest == row["prompt_sha256_16"], req["id"]
        output = _field(row, "output_token_ids")
        assert pool.path_map(prompt) == _field(row, "cached_before"), req["id"]
        assert pool.begin(req["id"], prompt) == int(row["num_cached_tokens"]), req["id"]
        pool.end(req["id"], prompt + output)
        pool.check_integrity()
        assert pool.path_map(prompt + output) == _field(row, "cached_after"), req["id"]
        counts = _field(row, "pool_after")
        assert (pool.num_free, pool.cached_keys_per_group()) == (
            counts["free_blocks"],
            counts["cached_hashes_per_group"],
        ), req["id"]
        builder.record(req["id"], prompt, output)


def test_scratch_pages_go_first_and_evictions_report_lost_states() -> None:
    B = 4
    lost: list[int] = []
    pool = VllmPagePool(
        12, B, num_state_groups=1, on_state_lost=lambda tokens, depth, salt: lost.append(depth)
    )
    first = list(range(10))  # R = floor(9 / 4) * 4 = 8: prefill chunks [0, 8) and [8, 10)
    assert pool.begin("a", first) == 0
    pool.end("a", first + [100, 101])
    pool.check_integrity()
    assert pool.path_map(first) == {"mamba0": ".1", "attn1": "11"}
    assert pool.lookup(first) == (8, 8)
    assert pool.lookup(first[:8] + [7, 7, 7]) == (8, 8)
    # Free queue now: a's running-state and partial attention pages (unhashed) at the head, then the never
    # used pages, then a's state at 8 (freed during decode), then its attention blocks tail first.
    fresh = list(range(200, 236))  # 9 attention pages + state pages: takes the cached ones last
    assert pool.begin("c", fresh) == 0
    assert lost == []  # begin only looks up and touches
    pool.advance("c", fresh, 32)  # the chunk [0, 32) to R
    assert lost == [8]
    pool.end("c", fresh + [1])
    pool.check_integrity()
    assert pool.lookup(first) == (0, 0)
    assert pool.num_evicted == 3


def test_a_request_cannot_grow_past_the_free_pages_until_another_is_released() -> None:
    """Side by side, requests share the pool: growth the pool cannot give is refused (the engine then
    preempts, as vLLM's scheduler does) instead of running on pages nobody was charged for."""
    B = 4
    pool = VllmPagePool(12, B, num_state_groups=1)
    a, b = list(range(10)), list(range(100, 110))
    assert pool.begin("a", a) == 0 and pool.begin("b", b) == 0
    pool.advance("a", a, 8)
    pool.advance("b", b, 8)
    # 11 usable pages; a and b hold 3 each (2 attention, 1 running state): 5 free.
    assert pool.num_free == 5
    assert pool.can_grow("a", 12)  # one more attention page and one state page
    assert not pool.can_grow("a", 36)  # 9 blocks: 7 attention pages and a state page
    pool.release("b")
    assert pool.num_free == 8 and pool.can_grow("a", 36)
    pool.check_integrity()
