"""--kv-cache-dtype fp8 through the engine (tiny presets, CPU): prefix hits over an fp8 cache give the
tokens and logits of the same prompts without hits; against the model-dtype cache, the first greedy token
agrees (or the two are tied within the fp8 error) and the prompt's logits stay within a stated bound; the
plan holds about twice the attention blocks for the same bytes (the simulator plans with the same code); the
host tier restores fp8 KV exactly, and a store written by an fp8 engine is a miss, never a corrupt restore,
for an engine with another KV dtype."""

import random

import pytest
import torch

from flashstate import LLM, SamplingParams
from flashstate.cache.memory_plan import plan_cache
from flashstate.cache.policy import vllm_geometry
from flashstate.config import EngineConfig
from flashstate.models.presets import preset_dir
from flashstate.sim.engine import host_tier
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.preset_configs import PRESETS

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
ENGINE = dict(block_size=4, prefill_cost_coefficients=(1e-5, 1e-8))
# The prompts' last-position logits with an fp8 KV cache against the model-dtype cache (fp32 and bf16
# tiny presets): 0.2% to 1.9% relative (measured); a misread cache (wrong scale, raw bytes, a stale block)
# is off by orders more.
FP8_LOGITS_REL = 0.05
# Hits against no hits, both over fp8: the fp32 sums differ only in order (chunking, export positions),
# ~1e-6 relative, but where a value lies on an fp8 rounding edge that difference moves it one fp8 step:
# up to 3.4e-5 measured (tiny-kimi-linear, a spare export splitting the prefill). A misread block is
# off by the fp8 error itself, 2e-3 or more.
FP8_HIT_REL = 5e-4


def _capture(llm: LLM) -> dict[str, list[torch.Tensor]]:
    logits: dict[str, list[torch.Tensor]] = {}

    def hook(ids, rows):
        for rid, row in zip(ids, rows, strict=True):
            logits.setdefault(rid, []).append(row.float().clone())

    llm.engine.runner.on_logits = hook
    return logits


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


@pytest.mark.parametrize(
    "preset, policy",
    [
        ("tiny", "flashstate"),
        ("tiny", "vllm"),
        ("tiny-kimi-linear", "flashstate"),
        ("tiny-nemotron-h", "sglang"),
    ],
)
def test_fp8_prefix_hits_equal_the_same_prompts_without_hits(preset, policy):
    model = str(preset_dir(preset))
    small = dict(max_num_batched_tokens=32, mamba_block_size=12)
    cached = LLM(model, kv_cache_dtype="fp8", cache_policy=policy, **small, **ENGINE)
    plain = LLM(
        model, kv_cache_dtype="fp8", enable_prefix_caching=False, max_num_batched_tokens=4096, **ENGINE
    )
    assert all(k.dtype == torch.float8_e4m3fn for k, _ in cached.engine.runner.caches.kv)
    got, want = _capture(cached), _capture(plain)
    rng = random.Random(0)
    vocab = cached.engine.spec.vocab_size
    agents = [_tokens(rng, rng.randint(30, 70), vocab) for _ in range(3)]
    hits = []
    for _ in range(3):
        prompts = agents + [agents[0][: rng.randint(8, 30)] + _tokens(rng, 9, vocab)]  # a fork mid-context
        outs, refs = cached.generate(prompts, PARAMS), plain.generate(prompts, PARAMS)
        for out, ref in zip(outs, refs, strict=True):
            assert out.token_ids == ref.token_ids
            hits.append(out.num_cached_tokens)
            for a, b in zip(got[out.request_id], want[ref.request_id], strict=True):
                assert float((a - b).norm() / b.norm()) <= FP8_HIT_REL
        cached.engine.check_integrity()
        agents = [
            p + o.token_ids + _tokens(rng, rng.randint(1, 20), vocab)
            for p, o in zip(agents, outs[:3], strict=True)
        ]
    assert sum(h > 0 for h in hits) >= 6, hits
    cached.engine.close()
    plain.engine.close()


@pytest.mark.parametrize("preset", ["tiny", "tiny-kimi-linear", "tiny-nemotron-h"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_against_the_model_dtype_cache(preset, dtype):
    model = str(preset_dir(preset))
    prompts = [[(7 * i + 3 * j) % 1500 + 3 for i in range(40 + 13 * j)] for j in range(4)]
    first = SamplingParams(temperature=0.0, max_tokens=1)
    runs = {}
    for kv in ("auto", "fp8"):
        no_cache = dict(enable_prefix_caching=False, max_num_batched_tokens=4096)
        with LLM(model, dtype=dtype, kv_cache_dtype=kv, **no_cache, **ENGINE) as llm:
            logits = _capture(llm)
            outs = llm.generate(prompts, first)
            runs[kv] = [o.token_ids for o in outs], [logits[o.request_id][0] for o in outs]
    for got, a, want, b in zip(*runs["fp8"], *runs["auto"], strict=True):
        moved = a - b
        rel = float(moved.norm() / b.norm())
        assert 0 < rel <= FP8_LOGITS_REL, rel  # > 0: the cache really is fp8
        # the greedy token agrees, or the model-dtype logits rank the two within the fp8 error (a
        # bf16 near-tie: one ulp apart, equal once the fp8 cache moved them)
        gap = float(b[want[0]] - b[got[0]])
        assert got == want or gap <= 2 * float(moved.abs().max()), (got, want, gap)


@pytest.mark.parametrize("policy", ["flashstate", "sglang", "none"])
def test_the_plan_holds_twice_the_attention_blocks_in_the_same_bytes(policy):
    kw = dict(ENGINE, kv_cache_memory_bytes=64 << 20, cache_policy=policy)
    kw |= {"enable_prefix_caching": False} if policy == "none" else {}
    blocks = {}
    for kv in ("auto", "fp8"):
        with LLM(str(preset_dir("tiny")), dtype="bfloat16", kv_cache_dtype=kv, **kw) as llm:
            plan = llm.engine.plan
            blocks[kv] = plan.num_blocks, plan.bytes_per_block, plan.bytes_per_slot
    assert blocks["fp8"][1] * 2 == blocks["auto"][1] and blocks["fp8"][2] == blocks["auto"][2]
    assert 1.95 <= blocks["fp8"][0] / blocks["auto"][0] <= 2.05, blocks


def test_the_vllm_geometry_and_the_simulator_count_fp8_bytes():
    """vLLM sizes its attention block so that a page holds one state: with fp8 KV a page of about the same
    bytes holds about twice the tokens. The simulator plans with plan_cache and prices its host tier's KV
    alike."""
    spec = spec_from_hf(PRESETS["qwen3-next-2b"])
    auto, fp8 = (
        EngineConfig(cache_policy="vllm", kv_cache_dtype=kv, device="cuda") for kv in ("auto", "fp8")
    )
    geo_auto, geo_fp8 = vllm_geometry(auto, spec, torch.bfloat16), vllm_geometry(fp8, spec, torch.bfloat16)
    # the attention block, a multiple of 128 tokens whose page holds a state, nearly doubles
    assert 2 * geo_auto.block - 128 <= geo_fp8.block <= 2 * geo_auto.block
    assert 0.9 <= geo_fp8.page_bytes / geo_auto.page_bytes <= 1.0
    budget = 4 << 30
    flash = [EngineConfig(kv_cache_dtype=kv) for kv in ("auto", "fp8")]
    plans = [plan_cache(spec, c, torch.bfloat16, budget) for c in flash]
    assert plans[1].bytes_per_block * 2 == plans[0].bytes_per_block
    assert 1.95 <= plans[1].num_blocks / plans[0].num_blocks <= 2.05
    configs = [EngineConfig(kv_cache_dtype=kv, host_cache="memory") for kv in ("auto", "fp8")]
    tiers = [host_tier(c, spec, torch.bfloat16, None, lambda: 0.0) for c in configs]
    assert tiers[1].token_bytes * 2 == tiers[0].token_bytes and tiers[1].state_bytes == tiers[0].state_bytes


def test_fp8_e5m2_serves_with_hits():
    with LLM(str(preset_dir("tiny")), kv_cache_dtype="fp8_e5m2", max_num_batched_tokens=64, **ENGINE) as llm:
        assert llm.engine.runner.caches.kv[0][0].dtype == torch.float8_e5m2
        prompt = list(range(3, 60))
        first = llm.generate([prompt], PARAMS)[0]
        again = llm.generate([prompt + first.token_ids + [7, 8]], PARAMS)[0]
        assert again.num_cached_tokens > 0
        llm.engine.check_integrity()


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int8")


HOST = dict(ENGINE, max_num_batched_tokens=256, host_chunk_tokens=256, host_cache_bytes=64 << 20)


def test_fp8_host_restores_equal_full_recompute():
    model = str(preset_dir("tiny"))
    cached = LLM(model, kv_cache_dtype="fp8", **HOST)
    plain = LLM(
        model, kv_cache_dtype="fp8", enable_prefix_caching=False, max_num_batched_tokens=4096, **ENGINE
    )
    got, want = _capture(cached), _capture(plain)
    rng = random.Random(3)
    vocab = cached.engine.spec.vocab_size
    contexts = [_tokens(rng, n, vocab) for n in (300, 520)]  # a chunk object, and a chunk plus a tail
    for turn in range(3):
        outs, refs = cached.generate(contexts, PARAMS), plain.generate(contexts, PARAMS)
        for out, ref in zip(outs, refs, strict=True):
            assert out.token_ids == ref.token_ids
            for a, b in zip(got[out.request_id], want[ref.request_id], strict=True):
                assert float((a - b).norm() / b.norm()) <= FP8_HIT_REL
        if turn:
            assert all(o.num_cached_tokens == len(c) - 31 for o, c in zip(outs, contexts, strict=True))
        cached.engine.host.flush()
        cached.engine.reset_prefix_cache()  # the next turn can only hit the host tier
        contexts = [c + o.token_ids + _tokens(rng, 30, vocab) for c, o in zip(contexts, outs, strict=True)]
    s = cached.engine.host.stats
    assert s.restores == 4 and s.misses_corrupt == 0
    cached.engine.close()
    plain.engine.close()


def test_a_store_written_with_fp8_kv_misses_for_another_kv_dtype(mooncake_master):
    """A server restarted with another --kv-cache-dtype over the same store: the fp8 engine's states are
    not found (other keys), nothing is restored into the bf16 cache; an fp8 reader finds them."""
    model = str(preset_dir("tiny"))
    store = dict(host_cache="mooncake", mooncake_master=mooncake_master.address)
    writer = LLM(model, kv_cache_dtype="fp8", **HOST, **store)
    rng = random.Random(5)
    vocab = writer.engine.spec.vocab_size
    first = [_tokens(rng, 300, vocab)]
    out = writer.generate(first, PARAMS)[0]
    writer.engine.host.flush()
    resumed = [first[0] + out.token_ids + _tokens(rng, 20, vocab)]
    for kv, hit in (("auto", False), ("fp8_e5m2", False), ("fp8", True)):
        with LLM(model, kv_cache_dtype=kv, **HOST, **store) as reader:
            plain = LLM(model, kv_cache_dtype=kv, enable_prefix_caching=False, **ENGINE)
            got = reader.generate(resumed, PARAMS)[0]
            assert got.token_ids == plain.generate(resumed, PARAMS)[0].token_ids
            s = reader.engine.host.stats
            assert (got.num_cached_tokens > 0, s.restores) == ((True, 1) if hit else (False, 0)), kv
            assert s.misses_corrupt == 0
            plain.engine.close()
    writer.engine.close()


def test_an_fp8_object_checked_against_a_bf16_layout_is_a_layout_miss():
    """The second guard under the keys: an object's tensor specs carry its dtype."""
    from flashstate.cache.host.codec import check, encode

    k = torch.randn(4, 2, 8).to(torch.float8_e4m3fn)
    obj = encode("flashstate/x/kv/00", [k])
    assert check("flashstate/x/kv/00", obj, [(torch.float8_e4m3fn, (4, 2, 8))]) == (
        [(torch.float8_e4m3fn, (4, 2, 8))],
        "ok",
    )
    assert check("flashstate/x/kv/00", obj, [(torch.bfloat16, (4, 2, 8))]) == (None, "layout")
