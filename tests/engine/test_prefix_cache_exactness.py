"""Exactness through the engine: multi-turn agents, branches and sub-agent forks with prefix hits at
arbitrary depths give the same greedy tokens and the same fp32 logits (1e-5) as full recompute."""

import random

import pytest
import torch

from flashstate import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def _capture(llm: LLM) -> dict[str, list[torch.Tensor]]:
    logits: dict[str, list[torch.Tensor]] = {}

    def hook(ids, rows):
        for rid, row in zip(ids, rows, strict=True):
            logits.setdefault(rid, []).append(row.clone())

    llm.engine.runner.on_logits = hook
    return logits


def _rounds(rng: random.Random, vocab: int):
    """Yields lists of prompts built from earlier prompts and outputs (sent back via `.send`)."""
    agents = [[rng.randrange(vocab) for _ in range(rng.randint(20, 60))] for _ in range(3)]
    for _ in range(4):
        prompts = list(agents)
        # A sub-agent fork: a prefix of one agent's context cut at an arbitrary point, plus its own task.
        src = rng.choice(agents)
        prompts.append(
            src[: rng.randint(5, len(src))] + [rng.randrange(vocab) for _ in range(rng.randint(3, 30))]
        )
        outputs = yield prompts
        for a in range(3):
            agents[a] = prompts[a] + outputs[a] + [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]


@pytest.mark.parametrize("policy", ["flashstate", "vllm", "sglang"])
def test_hits_at_arbitrary_depths_equal_full_recompute(tiny_model_dir, policy):
    cached = LLM(
        tiny_model_dir,
        cache_policy=policy,
        block_size=4,
        max_num_batched_tokens=32,
        mamba_block_size=12,
        prefill_cost_coefficients=(1e-5, 1e-8),
    )
    plain = LLM(tiny_model_dir, enable_prefix_caching=False, block_size=4, max_num_batched_tokens=4096)
    got, want = _capture(cached), _capture(plain)
    rng = random.Random({"flashstate": 1, "vllm": 2, "sglang": 3}[policy])
    gen = _rounds(rng, cached.engine.spec.vocab_size)
    prompts = next(gen)
    depths = []
    while True:
        outs = cached.generate(prompts, PARAMS)
        refs = plain.generate(prompts, PARAMS)
        for out, ref in zip(outs, refs, strict=True):
            assert out.token_ids == ref.token_ids
            depths.append(out.num_cached_tokens)
            for a, b in zip(got[out.request_id], want[ref.request_id], strict=True):
                assert float((a - b).norm() / b.norm()) <= 1e-5
        cached.engine.check_integrity()
        try:
            prompts = gen.send([o.token_ids for o in outs])
        except StopIteration:
            break
    hits = [d for d in depths if d]
    assert len(hits) >= 6, depths
    if policy == "vllm":
        assert all(d % 12 == 0 for d in hits)
    else:
        assert any(d % 4 for d in hits), "expected hits ending mid-block"
