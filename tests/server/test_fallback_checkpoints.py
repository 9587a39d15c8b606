"""Issue 31's two cases through real servers, at ample memory, `/v1/completions` with token-id prompts:

(a) an exact retry: a 390-token prompt answered with 20 tokens, then sent again unchanged;
(b) the next turn leaves the cached path d = 10 tokens before the frontier (inside the previous reply,
    as a re-tokenized output does) and goes on with new tokens.

The `flashstate` policy caches at least what the `vllm` policy caches in both (for (b) that is vLLM's
deepest state at or below the divergence); with its fallback checkpoints off it caches nothing, which is
the issue as reported.
"""

from __future__ import annotations

import random

import pytest

from tests.server.conftest import running_servers

COST = ["--prefill-cost-coefficients", "1e-5", "1e-10"]
ARGS = ["--max-model-len", "2k", *COST]
PROMPT, REPLY, D = 390, 20, 10
POLICIES = {
    "flashstate": ["--cache-policy", "flashstate"],
    "vllm": ["--cache-policy", "vllm"],
    "flashstate-off": ["--cache-policy", "flashstate", "--mamba-fallback-checkpoints", "off"],
}


@pytest.fixture(scope="module")
def cached(module_tmp) -> dict[str, dict[str, int]]:
    """Policy → case → cached tokens of the second request, each policy on a server of its own."""
    with running_servers(module_tmp, {name: ARGS + policy for name, policy in POLICIES.items()}) as servers:
        return {name: {"retry": retry(s, 1), "diverge": diverge(s, 2)} for name, s in servers.items()}


def complete(server, prompt: list[int], max_tokens: int = REPLY) -> tuple[list[int], int]:
    """(generated ids, cached prompt tokens) of one greedy completion of exactly `max_tokens` tokens."""
    status, body = server.post_json(
        "/v1/completions",
        {
            "model": "flashstate-tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, body
    ids = body["choices"][0]["token_ids"]
    assert len(ids) == max_tokens
    return ids, body["usage"]["prompt_tokens_details"]["cached_tokens"]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1500) for _ in range(n)]


def retry(server, seed: int) -> int:
    prompt = tokens(random.Random(seed), PROMPT)
    _, first = complete(server, prompt)
    assert first == 0
    return complete(server, prompt)[1]


def diverge(server, seed: int) -> int:
    """The second prompt follows prompt + reply to D tokens before the frontier (PROMPT + REPLY - 1), then
    differs: the reply re-tokenized from there on, and a new user turn."""
    rng = random.Random(seed)
    prompt = tokens(rng, PROMPT)
    reply, _ = complete(server, prompt)
    keep = REPLY - 1 - D  # reply tokens on the cached path
    changed = [(t + 1) % 1500 + 3 for t in reply[keep:]]
    return complete(server, prompt + reply[:keep] + changed + tokens(rng, 55))[1]


def test_retry_caches_at_least_what_vllm_does(cached):
    assert cached["vllm"]["retry"] > 0, cached
    assert cached["flashstate"]["retry"] >= cached["vllm"]["retry"], cached
    assert cached["flashstate"]["retry"] == PROMPT - 1  # the fallback one token before the prompt's end


def test_divergence_before_the_frontier_caches_at_least_what_vllm_does(cached):
    assert cached["vllm"]["diverge"] > 0, cached
    assert cached["flashstate"]["diverge"] >= cached["vllm"]["diverge"], cached


def test_without_fallbacks_both_cases_miss(cached):
    """The issue as reported: the frontier alone serves neither case."""
    assert cached["flashstate-off"]["retry"] == 0, cached
    assert cached["flashstate-off"]["diverge"] == 0, cached
