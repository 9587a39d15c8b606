"""Our Triton kernels over an fp8 KV cache (--kv-cache-dtype fp8 / fp8_e5m2) against the naive oracle over
the same cache: the store writes the oracle's bytes (saturated), the paged attention reads them upcast to
q's dtype. On CUDA when there is one, else in Triton's interpreter (needs `triton`: CI's CPU venv skips
this file). The last test runs on CUDA only, at a real model's attention shapes."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit of our kernels
triton = pytest.importorskip("triton")

from flashstate.ops.attention import naive as attn_naive  # noqa: E402
from flashstate.ops.attention import triton as attn_triton  # noqa: E402
from flashstate.ops.attention.kv_cast import to_kv_cache  # noqa: E402
from flashstate.ops.attention.triton import paged_attention, store_kv  # noqa: E402
from flashstate.ops.qk_norm_rope import naive as qk_naive  # noqa: E402
from flashstate.ops.qk_norm_rope.triton import qk_norm_rope_store  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# The 16-bit q dtype: bf16 on CUDA; in the interpreter fp16 stands in (it computes bf16 dots wrongly, for
# bf16 caches too: numpy has no bf16).
HALF = torch.bfloat16 if CUDA else torch.float16
# against the oracle over the same fp8 values: fp32 q runs tf32 dots on a GPU (1e-3 to 2.2e-3 relative
# measured for fp32 caches), 16-bit q rounds the probabilities to its dtype before P·V as the kernel does
# for 16-bit caches; a wrong byte order, scale or cast is off by orders more
REL = {torch.float32: 5e-3, HALF: 2e-2}


@pytest.fixture(autouse=True)
def _sms(monkeypatch):
    """The decode split count asks the device for its SMs: the interpreter has none (an H200's 132)."""
    if not CUDA:
        monkeypatch.setattr(attn_triton, "num_sms", lambda device: 132)


def rel(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def _bytes(t):
    return t.cpu().view(torch.uint8)


def _paged(q_lens, ctx, hq, hkv, d, dv, page, fp8, dtype, seed=1):
    """q and an fp8 paged cache (K/V past the format's range included) at random blocks."""
    g = torch.Generator().manual_seed(seed)
    nb = sum(-(-c // page) for c in ctx) + 3
    kc = to_kv_cache(torch.randn(nb, page, hkv, d, generator=g) * 4, fp8)
    vc = to_kv_cache(torch.randn(nb, page, hkv, dv, generator=g), fp8)
    kc.view(torch.uint8)[::5, 0, 0, 0] = to_kv_cache(torch.tensor([1e6]), fp8).view(torch.uint8)  # saturated
    perm, table, j = (
        torch.randperm(nb, generator=g),
        torch.zeros(len(ctx), max(ctx) // page + 2, dtype=torch.int32),
        0,
    )
    for i, c in enumerate(ctx):
        table[i, : -(-c // page)] = perm[j : j + -(-c // page)]
        j += -(-c // page)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=g).to(dtype)
    return q, kc, vc, cu, torch.tensor(ctx, dtype=torch.int32), table


def _attend(q, kc, vc, cu, cl, bt, scale, **kw):
    return paged_attention(
        q.to(DEV), kc.to(DEV), vc.to(DEV), cu_seqlens=cu.to(DEV), context_lens=cl.to(DEV),
        block_tables=bt.to(DEV), scale=scale, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_store_kv_writes_the_oracles_saturated_bytes(fp8):
    k, v = torch.randn(5, 2, 8) * 300, torch.randn(5, 2, 8) * 1e5  # past e4m3's 448 and e5m2's 57344
    slots = torch.tensor([9, 0, 3, 15, 4])
    kc1, vc1 = torch.zeros(4, 4, 2, 8, dtype=fp8), torch.zeros(4, 4, 2, 8, dtype=fp8)
    kc2, vc2 = kc1.to(DEV), vc1.to(DEV)
    attn_naive.store_kv(k, v, kc1, vc1, slots)
    store_kv(k.to(DEV), v.to(DEV), kc2, vc2, slots.to(DEV))
    assert torch.equal(_bytes(kc2), _bytes(kc1)) and torch.equal(_bytes(vc2), _bytes(vc1))
    assert torch.isfinite(vc2.cpu().float()).all()


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize(
    "q_lens, ctx, hq, hkv, d, dv, page, kw",
    [
        ([5, 9, 1], [5, 20, 7], 4, 2, 16, 16, 4, {}),  # prefill over prefixes, GQA
        ([1, 1, 1], [5, 40, 7], 4, 2, 16, 16, 4, {"kv_splits": 3}),  # decode, split keys
    ],
)
def test_paged_attention_over_fp8_matches_the_oracle(q_lens, ctx, hq, hkv, d, dv, page, kw, dtype, fp8):
    q, kc, vc, cu, cl, bt = _paged(q_lens, ctx, hq, hkv, d, dv, page, fp8, dtype)
    ref = attn_naive.paged_attention(
        q.float(), kc, vc, cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=0.3
    )
    out = _attend(q, kc, vc, cu, cl, bt, 0.3, block_m=16, block_n=16, **kw)
    assert out.dtype == dtype and rel(out, ref) < REL[dtype]


def test_paged_attention_over_an_fp8_latent_cache_matches_the_oracle():
    """MLA: one shared latent head, V a view of its first dv values; a 256 + 32 head split, decode splits."""
    q, kc, _, cu, cl, bt = _paged([4, 1], [20, 33], 4, 1, 288, 256, 4, torch.float8_e4m3fn, HALF)
    ref = attn_naive.paged_attention(
        q.float(), kc, kc[..., :256], cu_seqlens=cu, context_lens=cl, block_tables=bt, scale=0.05
    )
    kc_dev = kc.to(DEV)
    out = paged_attention(
        q.to(DEV), kc_dev, kc_dev[..., :256], cu_seqlens=cu.to(DEV), context_lens=cl.to(DEV),
        block_tables=bt.to(DEV), scale=0.05, block_m=16, block_n=16,
    )  # fmt: skip
    assert rel(out, ref) < REL[HALF]


@pytest.mark.skipif(not CUDA, reason="the interpreter rounds fp32 to fp8 wrongly (31.4 becomes 16, not 32)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_rope_store_into_fp8_matches_the_separate_forms(dtype):
    g = torch.Generator().manual_seed(3)
    t, heads, kv_heads, d = 6, 4, 2, 48
    q, k = torch.randn(t, heads, d, generator=g).to(dtype), torch.randn(t, kv_heads, d, generator=g).to(dtype)
    v = (torch.randn(t, kv_heads, d, generator=g) * 300).to(dtype)  # some past ±448
    qw, kw = (torch.randn(d, generator=g) * 200).to(dtype), (torch.randn(d, generator=g) * 200).to(dtype)
    angles = torch.rand(t, 8, generator=g) * 6
    cos, sin = (f(torch.cat([angles, angles], dim=-1)).to(dtype) for f in (torch.cos, torch.sin))
    slots = torch.tensor([3, 17, 0, 9, 10, 19])
    args = dict(eps=1e-6, offset=1.0, cos=cos, sin=sin)
    fp8 = torch.float8_e4m3fn
    want_k, want_v = torch.zeros(5, 4, kv_heads, d, dtype=fp8), torch.zeros(5, 4, kv_heads, d, dtype=fp8)
    qk_naive.qk_norm_rope_store(q, k, v, qw, kw, k_cache=want_k, v_cache=want_v, slot_mapping=slots, **args)
    got_k, got_v = want_k.new_zeros(want_k.shape).to(DEV), want_v.new_zeros(want_v.shape).to(DEV)
    dev = {key: x.to(DEV) for key, x in (("cos", cos), ("sin", sin))}
    qk_norm_rope_store(
        q.to(DEV), k.to(DEV), v.to(DEV), qw.to(DEV), kw.to(DEV), k_cache=got_k, v_cache=got_v,
        slot_mapping=slots.to(DEV), eps=1e-6, offset=1.0, **dev,
    )  # fmt: skip
    assert want_k.float().abs().max() == 448  # the norm weights push some keys past the range
    assert torch.equal(_bytes(got_v), _bytes(want_v))  # v: cast as it is, saturated
    # k: normed and rotated in fp32 either way; a rounding tie may land one fp8 step apart
    diff = (got_k.cpu().float() - want_k.float()).abs()
    assert float(diff.max()) <= float(want_k.float().abs().max()) / 8
    assert float((diff > 0).float().mean()) < 0.02


@pytest.mark.skipif(not CUDA, reason="real attention shapes: CUDA only")
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize(
    "q_lens, ctx",
    [
        ([1] * 48, [8192] * 48),  # decode, batch 48 at 8k
        ([1] * 16, [32768] * 16),  # decode, batch 16 at 32k
        ([2048], [8192]),  # a prefill chunk over a 6k prefix
    ],
    ids=["decode-48x8k", "decode-16x32k", "chunk-2k-over-6k"],
)
def test_real_shapes_over_an_fp8_cache_on_cuda(q_lens, ctx, fp8):
    """Qwen3-Next's attention (16 query heads over 2 KV heads, head dim 256, bf16), 16-token pages: the
    kernel over the fp8 cache against the same kernel over the cache's values upcast to bf16 (a bf16
    cache the kernel is already checked on)."""
    q, kc, vc, cu, cl, bt = _paged(q_lens, ctx, 16, 2, 256, 256, 16, fp8, torch.bfloat16)
    got = _attend(q, kc, vc, cu, cl, bt, 256**-0.5)
    want = _attend(q, kc.to(torch.bfloat16), vc.to(torch.bfloat16), cu, cl, bt, 256**-0.5)
    assert rel(got, want) < 1e-3  # the same values after the upcast


@pytest.mark.skipif(not CUDA, reason="torch's fused SDPA path is taken on CUDA only")
def test_fused_sdpa_prefill_over_an_fp8_cache_on_cuda():
    """Fresh prompts of ≥ 256 tokens take torch's SDPA, which gathers the fp8 blocks and upcasts them."""
    from flashstate.ops.attention import paged_attention as routed
    from flashstate.ops.attention import sdpa

    q, kc, vc, cu, cl, bt = _paged([300, 1000], [300, 1000], 16, 2, 256, 256, 16, torch.float8_e4m3fn, HALF)
    kw = dict(cu_seqlens=cu.to(DEV), context_lens=cl.to(DEV), block_tables=bt.to(DEV), scale=256**-0.5)
    got = routed(q.to(DEV), kc.to(DEV), vc.to(DEV), **kw)
    want = sdpa.paged_attention(q.to(DEV), kc.to(DEV).to(HALF), vc.to(DEV).to(HALF), **kw)
    assert rel(got, want) < 1e-3  # the same values after the upcast
