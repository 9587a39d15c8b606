"""An fp8 KV cache (--kv-cache-dtype fp8 / fp8_e5m2) through the CPU ops: store_kv casts with scale 1.0,
saturating at the format's largest value; the naive and SDPA paged attention over the fp8 cache give
what the same op gives over the K/V quantized then dequantized into a cache of the query's dtype (the
upcast is exact: every fp8 value is a bf16 and an fp32 value). The Triton kernel's checks are in
tests/ops/gpu/test_kv_fp8_triton.py."""

import pytest
import torch

from flashstate.cache.cache_tensors import CacheTensors, kv_bytes_per_block, kv_dtype
from flashstate.ops.attention import naive, sdpa
from flashstate.ops.attention.kv_cast import to_kv_cache
from flashstate.ops.qk_norm_rope.naive import qk_norm_rope_store
from flashstate.spec.hf_config import spec_from_hf
from flashstate.spec.preset_configs import PRESETS

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
BS, HQ, HKV, D, DV = 16, 8, 2, 32, 24
# (new tokens, context): a fresh prompt, a chunk over a cached prefix ending mid-block, one decode
SPANS = [(37, 37), (21, 50), (1, 19)]
TABLES = torch.tensor([[3, 7, 1, 0], [9, 2, 11, 5], [4, 6, 0, 0]])


def _slots() -> torch.Tensor:
    """Every context position's slot (block · BS + offset), sequence by sequence."""
    out = []
    for i, (_, ctx) in enumerate(SPANS):
        pos = torch.arange(ctx)
        out.append(TABLES[i, pos // BS] * BS + pos % BS)
    return torch.cat(out)


def _dequantized(x: torch.Tensor, fp8: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 cache holds for `x`, back in `dtype`: clamped to the format's range, rounded."""
    m = torch.finfo(fp8).max
    return x.clamp(-m, m).to(fp8).to(dtype)


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_store_kv_saturates_at_the_formats_largest_value(fp8):
    m = torch.finfo(fp8).max
    k = torch.tensor([[[0.1, -2.5, 3 * m, -3 * m]]])  # [T=1, H=1, D=4]
    v = torch.tensor([[[1e6, -1e6, 0.0, 7.0]]])
    k_cache, v_cache = torch.zeros(2, 4, 1, 4, dtype=fp8), torch.zeros(2, 4, 1, 4, dtype=fp8)
    naive.store_kv(k, v, k_cache, v_cache, torch.tensor([5]))
    got_k, got_v = k_cache[1, 1, 0].float(), v_cache[1, 1, 0].float()
    assert got_k.tolist()[2:] == [m, -m] and got_v.tolist()[:2] == [m, -m]  # saturated: no NaN, no inf
    assert got_k[:2].tolist() == k[0, 0, :2].to(fp8).float().tolist()  # in range: torch's rounding
    assert torch.isfinite(k_cache.float()).all() and torch.isfinite(v_cache.float()).all()


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", [naive, sdpa], ids=["naive", "sdpa"])
def test_paged_attention_over_fp8_equals_attention_over_dequantized_kv(op, dtype, fp8):
    g = torch.Generator().manual_seed(0)
    slots = _slots()
    k = torch.randn(len(slots), HKV, D, generator=g) * 3
    v = torch.randn(len(slots), HKV, DV, generator=g)
    k[::7, 0, 0] = 1e4  # outliers past both formats' range: stored saturated
    q = torch.randn(sum(n for n, _ in SPANS), HQ, D, generator=g).to(dtype)
    kw = dict(
        cu_seqlens=torch.tensor([0, 37, 58, 59]),
        context_lens=torch.tensor([c for _, c in SPANS]),
        block_tables=TABLES,
        scale=D**-0.5,
    )
    k8, v8 = torch.zeros(12, BS, HKV, D, dtype=fp8), torch.zeros(12, BS, HKV, DV, dtype=fp8)
    op.store_kv(k, v, k8, v8, slots) if op is naive else naive.store_kv(k, v, k8, v8, slots)
    ref_k, ref_v = torch.zeros(12, BS, HKV, D, dtype=dtype), torch.zeros(12, BS, HKV, DV, dtype=dtype)
    naive.store_kv(_dequantized(k, fp8, dtype), _dequantized(v, fp8, dtype), ref_k, ref_v, slots)
    got = op.paged_attention(q, k8, v8, **kw)
    want = op.paged_attention(q, ref_k, ref_v, **kw)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same values once upcast: the same result
    if dtype == torch.float32:  # what the rounding costs against an fp32 cache (saturation aside)
        m = torch.finfo(fp8).max
        plain_k, plain_v = torch.zeros_like(ref_k), torch.zeros_like(ref_v)
        naive.store_kv(k.clamp(-m, m), v, plain_k, plain_v, slots)
        exact = naive.paged_attention(q, plain_k, plain_v, **kw)
        err = float((got - exact).norm() / exact.norm())
        assert err < {torch.float8_e4m3fn: 0.1, torch.float8_e5m2: 0.2}[fp8], err


def test_mla_latent_cache_in_fp8_equals_the_dequantized_latents():
    """MLA's cache: one latent head [c ‖ k_rope], V a view of its first `rank` values."""
    g = torch.Generator().manual_seed(1)
    rank, rope, hq = 48, 16, 4
    slots = _slots()
    c, k_rope = torch.randn(len(slots), rank, generator=g), torch.randn(len(slots), rope, generator=g)
    q = torch.randn(59, hq, rank + rope, generator=g)
    kw = dict(
        cu_seqlens=torch.tensor([0, 37, 58, 59]),
        context_lens=torch.tensor([c for _, c in SPANS]),
        block_tables=TABLES,
        scale=0.1,
    )
    outs = []
    for store, dtype in (
        (lambda x: x, torch.float8_e4m3fn),
        (lambda x: _dequantized(x, torch.float8_e4m3fn, torch.float32), torch.float32),
    ):
        k_cache = torch.zeros(12, BS, 1, rank + rope, dtype=dtype)
        v_cache = k_cache[..., :rank]
        naive.store_kv(store(torch.cat([c, k_rope], -1))[:, None], store(c)[:, None], k_cache, v_cache, slots)
        outs.append(naive.paged_attention(q, k_cache, v_cache, **kw))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_the_fused_qk_norm_rope_store_writes_what_store_kv_writes():
    g = torch.Generator().manual_seed(2)
    t, h, hk, d = 5, 4, 2, 16
    q, k, v = (torch.randn(t, n, d, generator=g) * 1000 for n in (h, hk, hk))  # k, v: some past ±448
    w = torch.randn(d, generator=g) * 1000
    cos, sin = torch.randn(t, 8, generator=g), torch.randn(t, 8, generator=g)
    caches = (
        torch.zeros(2, 4, hk, d, dtype=torch.float8_e4m3fn),
        torch.zeros(2, 4, hk, d, dtype=torch.float8_e4m3fn),
    )
    slots = torch.tensor([0, 3, 4, 6, 7])
    qk_norm_rope_store(
        q, k, v, w, w, eps=1e-6, offset=0.0, cos=cos, sin=sin, k_cache=caches[0], v_cache=caches[1],
        slot_mapping=slots,
    )  # fmt: skip
    assert caches[0].float().abs().max() == 448 and caches[1].float().abs().max() == 448
    assert torch.isfinite(caches[0].float()).all()
    flat_v = caches[1].view(-1, hk, d)[slots]
    assert torch.equal(flat_v.view(torch.uint8), to_kv_cache(v, torch.float8_e4m3fn).view(torch.uint8))


def test_kv_dtype_names_and_block_bytes():
    assert kv_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert kv_dtype("fp8", torch.bfloat16) is kv_dtype("fp8_e4m3", torch.float32) is torch.float8_e4m3fn
    assert kv_dtype("fp8_e5m2", torch.bfloat16) is torch.float8_e5m2
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_dtype("int8", torch.bfloat16)
    spec = spec_from_hf(PRESETS["tiny"])
    bf16 = kv_bytes_per_block(spec, 16, torch.bfloat16)
    assert bf16 > 0 and kv_bytes_per_block(spec, 16, torch.float8_e4m3fn) * 2 == bf16


def test_fp8_cache_tensors_keep_states_in_their_dtypes_and_copy_blocks():
    spec = spec_from_hf(PRESETS["tiny"])
    caches = CacheTensors.allocate(spec, 4, 16, 2, torch.bfloat16, kv_cache_dtype=torch.float8_e4m3fn)
    assert all(k.dtype == v.dtype == torch.float8_e4m3fn for k, v in caches.kv)
    assert all(conv.dtype == torch.bfloat16 and ssm.dtype == torch.float32 for conv, ssm in caches.states)
    k = caches.kv[0][0]
    k[1] = to_kv_cache(torch.randn(k[1].shape), k.dtype)
    caches.copy_block(1, 3)
    assert torch.equal(k[3].view(torch.uint8), k[1].view(torch.uint8))
