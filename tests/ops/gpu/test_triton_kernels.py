"""Our Triton kernels against the naive oracles: on CUDA when there is one, else in Triton's interpreter
(needs `triton` installed, so CI's CPU venv skips this file; run it in a venv with triton)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit of our kernels
triton = pytest.importorskip("triton")

from flashstate.ops.attention import naive as attn_naive  # noqa: E402
from flashstate.ops.attention.triton import paged_attention, store_kv  # noqa: E402
from flashstate.ops.pooled import chunk_offsets, states_at_exports  # noqa: E402
from flashstate.ops.pooled_triton import states_at_exports_fused, zero_fresh_slots  # noqa: E402
from flashstate.ops.short_conv import naive as conv_naive  # noqa: E402
from flashstate.ops.short_conv.triton import causal_conv1d  # noqa: E402
from flashstate.ops.ssd import naive as ssd_naive  # noqa: E402
from flashstate.ops.ssd.decode_triton import ssd_decode_in_place  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 paged attention against the fp32 oracle: tf32 dots on the H200 land at 1e-3 to 2.2e-3 relative
# (measured, 2026-11-30); a wrong key or mask is off by orders more
TF32_REL = 5e-3


def rel(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


@pytest.mark.parametrize("given_seqs", [False, True], ids=["derived", "metadata"])
def test_conv_matches_oracle_with_pooled_states_and_exports(given_seqs):
    """With the metadata's sequence of each token (`token_seqs`) or deriving it from cu_seqlens."""
    torch.manual_seed(0)
    lens, d = [5, 1, 2, 9], 40
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x, w, b = torch.randn(sum(lens), d), torch.randn(d, 4), torch.randn(d)
    pool = torch.randn(6, d, 3)
    idx, has = torch.tensor([3, 0, 5, 1]), torch.tensor([True, True, False, True])
    exports = torch.tensor([0, 4, 6, 7, 16])
    p1, p2 = pool.clone(), pool.to(DEV)
    y1, e1 = conv_naive.causal_conv1d(
        x,
        w,
        b,
        conv_state_pool=p1,
        state_indices=idx,
        has_initial_state=has,
        cu_seqlens=cu,
        export_token_ids=exports,
    )
    y2, e2 = causal_conv1d(
        x.to(DEV),
        w.to(DEV),
        b.to(DEV),
        conv_state_pool=p2,
        state_indices=idx.to(DEV),
        has_initial_state=has.to(DEV),
        cu_seqlens=cu.to(DEV),
        token_seqs=torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(DEV)
        if given_seqs
        else None,
        export_token_ids=exports.to(DEV),
    )
    assert rel(y2, y1) < 1e-5 and torch.equal(e2.cpu(), e1) and torch.equal(p2.cpu(), p1)


def _paged(q_lens, ctx, hq, hkv, d, dv, page):
    nb = sum(-(-c // page) for c in ctx) + 3
    kc, vc = torch.randn(nb, page, hkv, d), torch.randn(nb, page, hkv, dv)
    perm, table, j = (
        torch.randperm(nb),
        torch.zeros(len(ctx), max(-(-c // page) for c in ctx) + 1, dtype=torch.int32),
        0,
    )
    for i, c in enumerate(ctx):
        table[i, : -(-c // page)] = perm[j : j + -(-c // page)]
        j += -(-c // page)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return torch.randn(int(cu[-1]), hq, d), kc, vc, cu, torch.tensor(ctx, dtype=torch.int32), table


@pytest.mark.parametrize(
    "q_lens, ctx, hq, hkv, d, dv, page, kw",
    [
        ([5, 9, 1], [5, 20, 7], 4, 2, 16, 16, 4, {}),  # prefill over prefixes, GQA
        ([3, 12], [30, 12], 2, 2, 24, 16, 8, {}),  # head dims that are not powers of two, Dv ≠ D (MLA-like)
        ([1, 1, 1], [5, 40, 7], 4, 2, 16, 16, 4, {"kv_splits": 3}),  # decode, split keys
        ([1, 1], [70, 3], 8, 1, 16, 8, 4, {}),  # decode, group of 8
        ([1], [1500], 4, 2, 16, 16, 16, {}),  # decode, one long sequence: the default splits (6 of 256 keys)
    ],
)
def test_paged_attention_matches_oracle(q_lens, ctx, hq, hkv, d, dv, page, kw):
    torch.manual_seed(1)
    q, kc, vc, cu, cl, bt = _paged(q_lens, ctx, hq, hkv, d, dv, page)
    ref = attn_naive.paged_attention(q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=0.3)
    out = paged_attention(
        q.to(DEV),
        kc.to(DEV),
        vc.to(DEV),
        cu_seqlens=cu.to(DEV),
        context_lens=cl.to(DEV),
        block_tables=bt.to(DEV),
        scale=0.3,
        block_m=16,
        block_n=16,
        **kw,
    )
    assert rel(out, ref) < TF32_REL  # tf32 dots on a GPU; fp32 in the interpreter


def test_store_kv_writes_flat_slots():
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([9, 0, 3, 15, 4])
    kc1, vc1 = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    kc2, vc2 = kc1.to(DEV), vc1.to(DEV)
    attn_naive.store_kv(k, v, kc1, vc1, slots)
    store_kv(k.to(DEV), v.to(DEV), kc2, vc2, slots.to(DEV))
    assert torch.equal(kc2.cpu(), kc1) and torch.equal(vc2.cpu(), vc1)


def test_ssd_decode_updates_the_pool_in_place_like_the_oracle():
    torch.manual_seed(2)
    n, h, p, g, ns = 3, 4, 8, 2, 16
    x, dt, a = torch.randn(1, n, h, p), torch.randn(1, n, h), -torch.rand(h)
    b, c, dd, bias = torch.randn(1, n, g, ns), torch.randn(1, n, g, ns), torch.randn(h), torch.randn(h)
    pool, idx, has = torch.randn(5, h, p, ns), torch.tensor([4, 1, 2]), torch.tensor([True, False, True])
    p1, p2 = pool.clone(), pool.to(DEV)
    y1, _ = ssd_naive.fused_recurrent_ssd(
        x,
        dt,
        a,
        b,
        c,
        dd,
        dt_bias=bias,
        dt_limit=(0.0, 5.0),
        state_pool=p1,
        state_indices=idx,
        has_initial_state=has,
        cu_seqlens=torch.arange(n + 1),
    )
    y2 = ssd_decode_in_place(
        *(t.to(DEV) for t in (x, dt, a, b, c, dd)),
        dt_bias=bias.to(DEV),
        dt_softplus=True,
        dt_limit=(0.0, 5.0),
        state_pool=p2,
        state_indices=idx.to(DEV),
        has_initial_state=has.to(DEV),
    )
    assert rel(y2, y1) < 1e-5 and rel(p2, p1) < 1e-5


def test_zero_fresh_slots_clears_only_fresh_sequences():
    pool = torch.randn(5, 3, 70, 70, device=DEV)
    expected = pool.clone()
    expected[0], expected[2] = 0, 0
    zero_fresh_slots(
        pool, torch.tensor([4, 0, 2], device=DEV), torch.tensor([True, False, False], device=DEV)
    )
    assert torch.equal(pool, expected)


@pytest.mark.parametrize("per_channel, v_first", [(False, False), (True, False), (False, True)])
def test_fused_export_matches_the_torch_form(per_channel, v_first):
    torch.manual_seed(3)
    c, lens, h, hv, k, v = 16, [40, 1, 33, 20], 2, 4, 8, 16
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    t, nc = int(cu[-1]), int(chunk_offsets(cu, c)[-1])
    states = torch.randn(1, nc, hv, *((v, k) if v_first else (k, v)))
    keys, vals = torch.randn(1, t, h, k), torch.randn(1, t, hv, v)
    g = -torch.rand(1, t, hv, k) if per_channel else -torch.rand(1, t, hv)
    exports = torch.tensor([0, 15, 16, 39, 40, 41, 50, 73, 93])
    ref = states_at_exports(states, keys, vals, g, cu, exports, c, v_first=v_first)
    got = states_at_exports_fused(
        *(x.to(DEV) for x in (states, keys, vals, g, cu, chunk_offsets(cu, c), exports)),
        c,
        torch.float32,
        v_first=v_first,
    )
    assert rel(got, ref) < 1e-5


@pytest.mark.parametrize(
    "q_lens, ctx, d, dv, kw",
    [
        ([1, 1], [37, 9], 576, 512, {}),  # decode with MLA's latent heads: 512 + 64 for q·k, 512 for values
        ([4, 1], [20, 33], 288, 256, {}),  # a chunk over a prefix and a decode, a 256 + 32 split
        ([1, 1, 1], [50, 5, 18], 288, 256, {"kv_splits": 2}),
    ],
)
def test_paged_attention_over_a_latent_cache_matches_oracle(q_lens, ctx, d, dv, kw):
    # One shared KV head whose first dv values are the value (a view into the key cache), as MLA caches.
    torch.manual_seed(2)
    q, kc, _, cu, cl, bt = _paged(q_lens, ctx, 4, 1, d, dv, 4)
    vc = kc[..., :dv]
    ref = attn_naive.paged_attention(q, kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=0.05)
    kc_dev = kc.to(DEV)
    out = paged_attention(
        q.to(DEV), kc_dev, kc_dev[..., :dv], cu_seqlens=cu.to(DEV), context_lens=cl.to(DEV),
        block_tables=bt.to(DEV), scale=0.05, block_m=16, block_n=16, **kw,
    )  # fmt: skip
    assert rel(out, ref) < TF32_REL


def test_conv_keeps_the_window_at_each_spans_last_real_token():
    """A span padded past its real end (`span_ends`): the pool keeps the window ending at its last real token,
    as the oracle does."""
    torch.manual_seed(4)
    lens, d = [5, 1, 12], 40
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    ends = torch.tensor([2, 5, 10])  # the first span's tokens 3..4 and the last one's 11.. are pads
    x, w, b = torch.randn(sum(lens), d), torch.randn(d, 4), torch.randn(d)
    pool = torch.randn(6, d, 3)
    idx, has = torch.tensor([3, 0, 5]), torch.tensor([True, False, True])
    p1, p2 = pool.clone(), pool.to(DEV)
    kw = dict(state_indices=idx, has_initial_state=has, cu_seqlens=cu, span_ends=ends)
    y1, _ = conv_naive.causal_conv1d(x, w, b, conv_state_pool=p1, **kw)
    y2, _ = causal_conv1d(
        x.to(DEV), w.to(DEV), b.to(DEV), conv_state_pool=p2, **{k: v.to(DEV) for k, v in kw.items()}
    )
    assert rel(y2, y1) < 1e-5 and torch.equal(p2.cpu(), p1)
    assert torch.equal(p1[5], x[8:11].T)  # flat tokens 8..10, its last real ones, not its pads
    assert torch.equal(p1[3], x[0:3].T)  # the first span's window ends at its last real token, 2
