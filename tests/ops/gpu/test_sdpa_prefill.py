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
