"""Preemption into a checkpoint through the engine: a running set grown past its share of a small cache
preempts a request into a cache unit at its position (its KV blocks + a state checkpoint), which wins its
place over older cached units by the cache's priority; re-admitted, the request resumes from it (a prefix
hit on its own checkpoint, mid-output) and gives the same greedy tokens as a request never preempted."""

import random

import pytest

from flashstate import LLM, SamplingParams

BLOCK = 16
PARAMS = SamplingParams(temperature=0.0, max_tokens=160, ignore_eos=True)
FILLER = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def _engine(model: str, mode: str, shared_blocks: int, admission: bool) -> LLM:
    """Two requests at a time, a cache whose shared budget holds `shared_blocks` KV blocks (a checkpoint
    costs about 7 of them) beside the two requests' working states."""
    probe = LLM(model, block_size=BLOCK, max_num_seqs=2, kv_cache_memory_bytes=4 << 20)
    per_block, per_slot = probe.engine.cache.policy.bytes_per_block, probe.engine.cache.policy.bytes_per_slot
    probe.close()
    return LLM(
        model,
        block_size=BLOCK,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        kv_cache_memory_bytes=shared_blocks * per_block + 2 * per_slot,
        memory_admission=admission,
        # admitted on their prompts alone: their outputs grow the running set past its half of the cache
        admission_expected_output_tokens=1,
        admission_cache_reserve=0.5,
        mamba_fallback_checkpoints="off",
        preemption_mode=mode,
        prefill_cost_coefficients=(1e-5, 1e-8),
    )


def _run(llm: LLM, plain: LLM):
    rng = random.Random(0)
    vocab = llm.engine.spec.vocab_size
    # three short sessions' ends cached first: the units a preempted request's state competes with
    llm.generate([[rng.randrange(vocab) for _ in range(16)] for _ in range(3)], FILLER)
    prompts = [[rng.randrange(vocab) for _ in range(96)] for _ in range(2)]
    outs = llm.generate(prompts, PARAMS)
    refs = plain.generate(prompts, PARAMS)
    for out, ref in zip(outs, refs, strict=True):
        assert out.token_ids == ref.token_ids
    llm.engine.check_integrity()
    return outs


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_prefix_caching=False, block_size=BLOCK, max_num_batched_tokens=4096)
    yield llm
    llm.close()


@pytest.mark.parametrize("shared_blocks", [54, 58])
def test_a_request_preempted_into_a_checkpoint_resumes_from_it_with_the_same_tokens(
    tiny_model_dir, plain, shared_blocks
):
    llm = _engine(tiny_model_dir, "checkpoint", shared_blocks, admission=True)
    outs = _run(llm, plain)
    stats = llm.engine.scheduler.stats
    assert stats.preemptions_checkpoint >= 1 and stats.preemptions_recompute == 0
    preempted = [o for o in outs if o.stats.num_preemptions]
    assert preempted, "the running set was meant to outgrow its share"
    for out in preempted:  # it hit its own checkpoint, inside its output
        assert out.stats.num_resumed_tokens > out.stats.num_prompt_tokens
    llm.close()


def test_a_request_preempted_for_recompute_gives_the_same_tokens(tiny_model_dir, plain):
    llm = _engine(tiny_model_dir, "recompute", 30, admission=False)  # 2 x 16 blocks at the end > 30
    outs = _run(llm, plain)
    stats = llm.engine.scheduler.stats
    assert stats.preemptions_recompute >= 1 and stats.preemptions_checkpoint == 0
    assert any(o.stats.num_preemptions for o in outs)
    llm.close()
