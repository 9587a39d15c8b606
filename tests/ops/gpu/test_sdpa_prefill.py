import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA SDPA backends", allow_module_level=True)

from flashstate.ops.attention import naive, sdpa


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_prefill_matches_the_oracle_on_cuda(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    bs, hq, hkv, d = 16, 16, 2, 256
    k_cache = torch.randn(120, bs, hkv, d, device="cuda", generator=g).to(dtype)
    v_cache = torch.randn(120, bs, hkv, d, device="cuda", generator=g).to(dtype)
    spans = [(300, 300), (302, 543), (257, 601)]  # a fresh prompt, then chunks over cached prefixes
    tables = torch.arange(3 * 40, device="cuda").reshape(3, 40)  # 40 blocks cover 601 tokens
    cu = torch.tensor([0, 300, 602, 859], device="cuda")
    q = torch.randn(859, hq, d, device="cuda", generator=g).to(dtype)
    ctx = torch.tensor([c for _, c in spans], device="cuda")
    kw = dict(cu_seqlens=cu, context_lens=ctx, block_tables=tables, scale=d**-0.5)
    want = naive.paged_attention(q.float(), k_cache.float(), v_cache.float(), **kw)
    got = sdpa.paged_attention(q, k_cache, v_cache, **kw).float()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "spans",
    [
        [(300, 300), (400, 400)],  # whole prompts, long: fused SDPA
        [(300, 300), (302, 543)],  # one over a cached prefix: the paged kernel
        [(300, 300), (100, 100)],  # one short span
        [(1, 40)] * 300,  # decodes
    ],
)
def test_the_kernel_choice_from_host_spans_equals_the_one_read_on_the_device(spans):
    from flashstate.layers.metadata import ForwardMetadata
    from flashstate.ops.attention import fresh_prefill, long_spans

    q_lens, ctx = [q for q, _ in spans], [c for _, c in spans]
    tables = [list(range(-(-c // 16))) for c in ctx]
    meta = ForwardMetadata.build(q_lens, ctx, tables, 16, list(range(len(spans))), device="cuda")
    q = torch.zeros(sum(q_lens), 4, 64, device="cuda", dtype=torch.bfloat16)
    assert fresh_prefill(q, meta.cu_seqlens, meta.context_lens, meta.spans) == fresh_prefill(
        q, meta.cu_seqlens, meta.context_lens
    )
    assert long_spans(q, meta.cu_seqlens, meta.spans) == long_spans(q, meta.cu_seqlens)
