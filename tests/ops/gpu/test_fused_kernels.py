"""The fused prefill kernels (strided/fused RMSNorms, SiLU·mul, the conv's split output) against their torch
forms: on CUDA when there is one, else in Triton's interpreter (needs `triton` installed, so CI's CPU venv
skips this file; run it in a venv with triton)."""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit of our kernels
triton = pytest.importorskip("triton")

from flashstate.ops.activation import naive as act_naive  # noqa: E402
from flashstate.ops.activation.triton import silu_mul  # noqa: E402
from flashstate.ops.norm.triton import add_rms_norm, gated_rms_norm, rms_norm  # noqa: E402
from flashstate.ops.rotary import naive as rotary_naive  # noqa: E402
from flashstate.ops.rotary.triton import apply_rotary_  # noqa: E402
from flashstate.ops.short_conv import naive as conv_naive  # noqa: E402
from flashstate.ops.short_conv.triton import causal_conv1d  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _normed(x, eps=1e-6):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_norms_read_strided_views_and_fuse_the_residual_add():
    g = torch.Generator().manual_seed(0)
    t, h, n = 37, 3, 48
    wide = torch.randn(t, 4 * h * n, generator=g).to(DEV)  # a projection output: the inputs are views of it
    x = wide[:, : h * n].view(t, h, n)
    z = wide[:, 2 * h * n : 3 * h * n].view(t, h, n)
    q = wide.view(t, 2 * h, 2 * n)[..., :n]  # per head [query | gate]: rows strided, heads strided
    w = torch.randn(n, generator=g).to(DEV) * 0.1
    assert not x.is_contiguous() and not q.is_contiguous()
    torch.testing.assert_close(rms_norm(q, w, 1e-6, offset=1.0), _normed(q) * (1 + w))
    torch.testing.assert_close(gated_rms_norm(x, z, w, 1e-6), w * _normed(x) * F.silu(z))
    r = torch.randn(t, h, n, generator=g).to(DEV)
    y, s = add_rms_norm(x, r, w, 1e-6, offset=1.0)
    assert torch.equal(s, r + x) and s.is_contiguous() and y.shape == (t, h, n)
    torch.testing.assert_close(y, _normed(r + x) * (1 + w))
    flat = torch.randn(t, n, generator=g).to(DEV)
    torch.testing.assert_close(rms_norm(flat, w, 1e-6), _normed(flat) * w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_the_unfused_form(dtype):
    g = torch.Generator().manual_seed(1)
    gate_up = torch.randn(29, 3 * 1100, generator=g).to(DEV, dtype)[:, : 2 * 1100]  # strided rows
    got = silu_mul(gate_up)
    want = act_naive.silu_mul(gate_up.float())
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    assert got.shape == (29, 1100) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, **tol)


@pytest.mark.parametrize("splits", [[32, 32, 64], [16, 48], [8, 8, 24], [40]])
def test_conv_split_output_equals_the_parts_of_the_full_output(splits):
    torch.manual_seed(4)
    lens, d = [5, 1, 100, 9], sum(splits)  # tokens 32–95: tiles that never reach into a pool slot
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    wide = torch.randn(sum(lens), d + 24)
    x, w, b = wide[:, :d], torch.randn(d, 4), torch.randn(d)  # x: a strided view, like q|k|v of qkvz
    pool = torch.randn(6, d, 3)
    idx, has = torch.tensor([3, 0, 5, 1]), torch.tensor([True, True, False, True])
    exports = torch.tensor([0, 4, 6, 30, 54, 105, 110])
    p1, p2, p3 = pool.clone(), pool.clone().to(DEV), pool.clone()
    args = dict(state_indices=idx, has_initial_state=has, cu_seqlens=cu, export_token_ids=exports)
    y1, e1 = conv_naive.causal_conv1d(x, w, b, conv_state_pool=p1, **args)
    parts, e2 = causal_conv1d(
        x.to(DEV), w.to(DEV), b.to(DEV), conv_state_pool=p2, out_splits=splits,
        **{k: v.to(DEV) for k, v in args.items()},
    )  # fmt: skip
    assert len(parts) == len(splits)
    for part, want in zip(parts, y1.split(splits, dim=-1), strict=True):
        assert part.is_contiguous()
        torch.testing.assert_close(part.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(e2.cpu(), e1) and torch.equal(p2.cpu(), p1)
    naive_parts, _ = conv_naive.causal_conv1d(x, w, b, conv_state_pool=p3, out_splits=splits, **args)
    assert all(torch.equal(a, b) for a, b in zip(naive_parts, y1.split(splits, dim=-1), strict=True))


def test_conv_rejects_splits_that_do_not_cover_the_channels():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="out_splits"):
        causal_conv1d(
            x.to(DEV), torch.randn(16, 4).to(DEV), None, conv_state_pool=torch.zeros(1, 16, 3).to(DEV),
            state_indices=torch.tensor([0]).to(DEV), has_initial_state=torch.tensor([False]).to(DEV),
            cu_seqlens=torch.tensor([0, 4]).to(DEV), out_splits=[8, 4],
        )  # fmt: skip


@pytest.mark.parametrize("rotary_dims", [8, 12, 16])  # partial rotary; 12: half not a power of two
def test_rotary_in_place_matches_the_torch_form(rotary_dims):
    g = torch.Generator().manual_seed(5)
    t, h, d = 19, 3, 16
    pos = torch.arange(t, dtype=torch.float32)[:, None] * (
        1.0 / 100 ** (torch.arange(0, rotary_dims, 2) / rotary_dims)
    )
    cos, sin = torch.cat([pos, pos], -1).cos(), torch.cat([pos, pos], -1).sin()
    wide = torch.randn(t, h, 2 * d, generator=g)  # x: the query half of a [query | gate] projection
    want = rotary_naive.apply_rotary_(wide[..., :d].clone(), cos, sin)
    dev = wide.clone().to(DEV)
    got = apply_rotary_(dev[..., :d], cos.to(DEV), sin.to(DEV))
    assert got.data_ptr() == dev.data_ptr()  # in place
    torch.testing.assert_close(got.cpu(), want)
    assert torch.equal(dev[..., d:].cpu(), wide[..., d:])  # the gate half is untouched
    half = rotary_dims // 2
    x1, x2 = wide[..., :half], wide[..., half:rotary_dims]
    c, s = cos[:, None, :half], sin[:, None, :half]
    torch.testing.assert_close(want[..., :half], x1 * c - x2 * s)
    assert torch.equal(want[..., rotary_dims:], wide[..., rotary_dims:d])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 5, 300])
def test_gdn_gating_matches_the_torch_form(dtype, t):
    from flashstate.ops.gdn_gating import naive as gating_naive
    from flashstate.ops.gdn_gating.triton import gdn_gating

    g = torch.Generator().manual_seed(t)
    hv = 12
    ba = (torch.randn(t, 2 * hv, generator=g) * 8).to(DEV, dtype)  # in_proj_ba's output: b, a are views
    ba[0, hv] = 30.0  # softplus's pass-through above 20
    b, a = ba.split([hv, hv], dim=-1)
    a_log = torch.randn(hv, generator=g).to(DEV)
    dt_bias = torch.randn(hv, generator=g).to(DEV, dtype)
    got_g, got_beta = gdn_gating(a, b, a_log, dt_bias)
    want_g, want_beta = gating_naive.gdn_gating(a, b, a_log, dt_bias)
    assert got_g.dtype == torch.float32 and got_beta.dtype == dtype and got_g.shape == (t, hv)
    torch.testing.assert_close(got_g, want_g, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        got_beta.float(), want_beta.float(), rtol=1e-2 if dtype != torch.float32 else 1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="gates"):
        gdn_gating(a, b[:, :-1], a_log, dt_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_gate_reads_the_strided_gate_in_place(dtype):
    from flashstate.ops.activation.triton import sigmoid_mul

    g = torch.Generator().manual_seed(2)
    t, h, d = 7, 3, 40
    qg = torch.randn(t, h, 2 * d, generator=g).to(DEV, dtype)  # per head [query | gate], as q_proj emits
    gate = qg[..., d:]
    x = torch.randn(t, h, d, generator=g).to(DEV, dtype)
    got = sigmoid_mul(x, gate)
    want = x.float() * torch.sigmoid(gate.float())
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    assert got.shape == (t, h, d) and got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got.float(), want, **tol)
    with pytest.raises(ValueError, match="one \\[T, H, D\\] shape"):
        sigmoid_mul(x, gate[:, :, :-1])


@pytest.mark.parametrize("splits", [None, [32, 32, 64]])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_conv_decode_batch_updates_the_slots_in_place_like_the_general_path(splits, pool_dtype):
    torch.manual_seed(6)
    n, d = 5, 128
    wide = torch.randn(n, d + 16).to(pool_dtype)  # the model's dtype, as the pool's and the weights'
    x, w, b = wide[:, :d], torch.randn(d, 4).to(pool_dtype), torch.randn(d).to(pool_dtype)
    pool = torch.randn(8, d, 3).to(pool_dtype)
    idx, has = torch.tensor([6, 0, 3, 7, 1]), torch.tensor([True, False, True, True, False])
    cu = torch.arange(n + 1)  # one token per sequence
    exports = torch.tensor([1, 3])
    args = dict(state_indices=idx, has_initial_state=has, cu_seqlens=cu, export_token_ids=exports)
    want_pool = pool.clone()
    want, want_exported = conv_naive.causal_conv1d(
        x, w, b, conv_state_pool=want_pool, out_splits=splits, **args
    )
    got_pool = pool.clone().to(DEV)
    got, got_exported = causal_conv1d(
        x.to(DEV), w.to(DEV), b.to(DEV), conv_state_pool=got_pool, out_splits=splits,
        **{k: v.to(DEV) for k, v in args.items()},
    )  # fmt: skip
    for g_part, w_part in zip(got if splits else [got], want if splits else [want], strict=True):
        assert g_part.is_contiguous()
        tol = 1e-5 if pool_dtype == torch.float32 else 1e-2
        torch.testing.assert_close(g_part.cpu(), w_part, rtol=tol, atol=tol)
    assert torch.equal(got_pool.cpu(), want_pool)  # every slot: the decoded ones shifted, the rest untouched
    assert torch.equal(got_exported.cpu(), want_exported)
    assert torch.equal(got_pool[1, :, 2].cpu(), x[4].to(pool_dtype))  # a fresh sequence: [0, 0, x]
    assert not got_pool[1, :, :2].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_decode_with_gates_inside_updates_the_slots_like_the_gates_then_the_step(dtype):
    from flashstate.ops.gated_delta_rule import naive as gdr_naive
    from flashstate.ops.gated_delta_rule.decode_triton import decode_gated_delta_rule_in_place

    g = torch.Generator().manual_seed(9)
    n, heads, hv, dk, dv = 5, 2, 4, 16, 40  # dv: one full column block and a masked one
    q, k = (torch.randn(1, n, heads, dk, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(1, n, hv, dv, generator=g).to(dtype)
    ba = (torch.randn(n, 2 * hv + 3, generator=g) * 4).to(dtype)  # in_proj_ba's output: b, a are views
    b, a = ba[:, :hv], ba[:, hv : 2 * hv]
    a_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g).to(dtype)
    pool = torch.randn(8, hv, dk, dv, generator=g)
    idx, has = torch.tensor([6, 0, 3, 7, 1]), torch.tensor([True, False, True, True, False])
    exports = torch.tensor([1, 3])
    pooled = dict(state_indices=idx, has_initial_state=has, export_token_ids=exports)
    want_pool = pool.clone()
    want, want_exported = gdr_naive.decode_gated_delta_rule_in_place(
        q, k, v, a, b, a_log, dt_bias, state_pool=want_pool, use_qk_l2norm_in_kernel=True, **pooled
    )
    got_pool = pool.to(DEV)
    on_dev = {key: x.to(DEV) for key, x in pooled.items()}
    got, got_exported = decode_gated_delta_rule_in_place(
        q.to(DEV), k.to(DEV), v.to(DEV), a.to(DEV), b.to(DEV), a_log.to(DEV), dt_bias.to(DEV),
        state_pool=got_pool, use_qk_l2norm_in_kernel=True, **on_dev,
    )  # fmt: skip
    assert got.shape == (1, n, hv, dv) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=tol, atol=tol)
    # fp32 states; with bf16 inputs the oracle rounds its intermediates to bf16, the kernel does not
    torch.testing.assert_close(got_pool.cpu(), want_pool, rtol=tol, atol=tol)
    torch.testing.assert_close(got_exported.cpu(), want_exported, rtol=tol, atol=tol)
    untouched = [s for s in range(8) if s not in idx.tolist()]
    assert torch.equal(got_pool[untouched].cpu(), pool[untouched])
    with pytest.raises(ValueError, match="decode shapes"):
        decode_gated_delta_rule_in_place(
            q.to(DEV), k.to(DEV), v.to(DEV), a[:, :-1].to(DEV), b.to(DEV), a_log.to(DEV), dt_bias.to(DEV),
            state_pool=got_pool, **on_dev,
        )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary", [16, 48])
def test_qk_norm_rope_store_matches_the_separate_forms(dtype, rotary):
    from flashstate.ops.qk_norm_rope import naive as qk_naive
    from flashstate.ops.qk_norm_rope.triton import qk_norm_rope_store

    g = torch.Generator().manual_seed(rotary)
    t, heads, kv_heads, d = 6, 4, 2, 48
    qkv = torch.randn(t, 2 * heads * d + 2 * kv_heads * d, generator=g).to(dtype)  # the stacked GEMM's output
    qg, k, v = qkv.split([2 * heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = qg.view(t, heads, 2 * d)[..., :d]  # per head [query | gate]
    k, v = k.view(t, kv_heads, d), v.view(t, kv_heads, d)
    qw, kw = (torch.randn(d, generator=g) * 0.1).to(dtype), (torch.randn(d, generator=g) * 0.1).to(dtype)
    angles = torch.rand(t, rotary // 2, generator=g) * 6
    cos, sin = (f(torch.cat([angles, angles], dim=-1)).to(dtype) for f in (torch.cos, torch.sin))
    caches = torch.randn(2, 5, 4, kv_heads, d, generator=g).to(dtype)  # k, v: [blocks, block_size, Hk, D]
    slots = torch.tensor([3, 17, 0, 9, 10, 19])
    args = dict(eps=1e-6, offset=1.0, cos=cos, sin=sin)
    want_k, want_v = caches[0].clone(), caches[1].clone()
    want = qk_naive.qk_norm_rope_store(
        q, k, v, qw, kw, k_cache=want_k, v_cache=want_v, slot_mapping=slots, **args
    )
    got_k, got_v = caches[0].to(DEV), caches[1].to(DEV)
    dev_args = {key: x.to(DEV) if isinstance(x, torch.Tensor) else x for key, x in args.items()}
    got = qk_norm_rope_store(
        q.to(DEV), k.to(DEV), v.to(DEV), qw.to(DEV), kw.to(DEV), k_cache=got_k, v_cache=got_v,
        slot_mapping=slots.to(DEV), **dev_args,
    )  # fmt: skip
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert got.shape == (t, heads, d) and got.is_contiguous()
    torch.testing.assert_close(got.cpu(), want, **tol)
    torch.testing.assert_close(got_k.cpu(), want_k, **tol)
    assert torch.equal(got_v.cpu(), want_v)  # v is copied as it is; untouched slots stay
    untouched = [s for s in range(20) if s not in slots.tolist()]
    flat_k = got_k.cpu().view(20, kv_heads, d)
    assert torch.equal(flat_k[untouched], caches[0].view(20, kv_heads, d)[untouched])
