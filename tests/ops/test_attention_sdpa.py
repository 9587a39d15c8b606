import pytest
import torch

from flashstate.ops.attention import naive, sdpa


@pytest.mark.parametrize("gqa", ["1", "0"])  # grouped K/V heads into SDPA as they are, or repeated first
def test_sdpa_prefill_matches_the_oracle_over_cached_prefixes(monkeypatch, gqa):
    monkeypatch.setenv("FLASHSTATE_SDPA_GQA", gqa)
    monkeypatch.setattr(sdpa, "_GQA_CHOICE", {})
    g = torch.Generator().manual_seed(0)
    bs, hq, hkv, d, dv = 16, 8, 2, 32, 24
    k_cache = torch.randn(20, bs, hkv, d, generator=g)
    v_cache = torch.randn(20, bs, hkv, dv, generator=g)
    # (new tokens, context): a fresh prompt, a chunk over a cached prefix ending mid-block, one decode
    spans = [(37, 37), (21, 50), (1, 19)]
    tables = torch.tensor([[3, 7, 1, 0], [9, 2, 11, 5], [4, 6, 0, 0]])
    cu = torch.tensor([0, 37, 58, 59])
    q = torch.randn(59, hq, d, generator=g)
    kw = dict(
        cu_seqlens=cu, context_lens=torch.tensor([c for _, c in spans]), block_tables=tables, scale=d**-0.5
    )
    want = naive.paged_attention(q, k_cache, v_cache, **kw)
    got = sdpa.paged_attention(q, k_cache, v_cache, **kw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the fresh prompt took the grouped path: torch's CPU SDPA runs grouped heads with the same backend
    assert (True in sdpa._GQA_CHOICE.values()) == (gqa == "1")
