"""q/k RMSNorm, rotary and the KV-cache write in one Triton launch (four to six otherwise), one program
per (token, head) row; same contract as `naive.qk_norm_rope_store`. Each row is normalised in fp32 and
rounded to the input dtype before the rotation, as the separate kernels round it between them. An fp8 KV
cache gets k and v saturated at the format's largest value, as `store_kv` does (ops/attention/kv_cast.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.attention.kv_cast import fp8_max


@triton.jit
def _to_dst(y, dst, SAT: tl.constexpr):
    """`y` as `dst` stores it; SAT > 0: first clamped to ±SAT (an fp8 cache's largest value)."""
    if SAT > 0:
        y = tl.minimum(tl.maximum(y.to(tl.float32), -SAT), SAT)
    return y.to(dst.dtype.element_ty)


@triton.jit
def _norm_rope_row(
    src, w, dst, cos, sin, eps, offset, D, half, BLOCK: tl.constexpr, BHALF: tl.constexpr, SAT: tl.constexpr
):
    cols = tl.arange(0, BLOCK)
    x = tl.load(src + cols, mask=cols < D, other=0.0)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    wf = tl.load(w + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (xf * rstd * (wf + offset)).to(x.dtype)
    past_rotary = (cols < D) & (cols >= 2 * half)
    tl.store(dst + cols, _to_dst(y, dst, SAT), mask=past_rotary)
    i = tl.arange(0, BHALF)
    hm = i < half
    x1 = tl.load(src + i, mask=hm, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + i, mask=hm, other=0.0).to(tl.float32)
    w1 = tl.load(w + i, mask=hm, other=0.0).to(tl.float32)
    w2 = tl.load(w + half + i, mask=hm, other=0.0).to(tl.float32)
    y1 = (x1 * rstd * (w1 + offset)).to(x.dtype).to(tl.float32)
    y2 = (x2 * rstd * (w2 + offset)).to(x.dtype).to(tl.float32)
    c = tl.load(cos + i, mask=hm, other=0.0).to(tl.float32)
    s = tl.load(sin + i, mask=hm, other=0.0).to(tl.float32)
    tl.store(dst + i, _to_dst((y1 * c - y2 * s).to(x.dtype), dst, SAT), mask=hm)
    tl.store(dst + half + i, _to_dst((y2 * c + y1 * s).to(x.dtype), dst, SAT), mask=hm)


@triton.jit
def _qk_norm_rope_store_kernel(
    q,
    k,
    v,
    q_weight,
    k_weight,
    q_out,
    k_cache,
    v_cache,
    slots,
    cos,
    sin,
    eps,
    offset,
    H,
    HK,
    D,
    DV,
    half,
    stride_q_t,
    stride_q_h,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_c_t,
    BLOCK: tl.constexpr,
    BHALF: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SAT: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    cos_t, sin_t = cos + t * stride_c_t, sin + t * stride_c_t
    # The branches name their pointers apart: a name bound in both arms of a runtime `if` must keep one
    # type, and an fp8 cache's pointer is not q_out's.
    if j < H:
        q_src = q + t * stride_q_t + j * stride_q_h
        q_dst = q_out + (t * H + j) * D
        _norm_rope_row(q_src, q_weight, q_dst, cos_t, sin_t, eps, offset, D, half, BLOCK, BHALF, 0.0)
    else:
        hk = j - H
        slot = tl.load(slots + t).to(tl.int64)
        k_src = k + t * stride_k_t + hk * stride_k_h
        k_dst = k_cache + (slot * HK + hk) * D
        _norm_rope_row(k_src, k_weight, k_dst, cos_t, sin_t, eps, offset, D, half, BLOCK, BHALF, SAT)
        cv = tl.arange(0, BLOCK_V)
        vv = tl.load(v + t * stride_v_t + hk * stride_v_h + cv, mask=cv < DV, other=0.0)
        tl.store(v_cache + (slot * HK + hk) * DV + cv, _to_dst(vv, v_cache, SAT), mask=cv < DV)


def qk_norm_rope_store(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    *,
    eps: float,
    offset: float,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
) -> Tensor:
    """q: [T, H, D]; k: [T, Hk, D]; v: [T, Hk, Dv]; heads' last dims contiguous; caches contiguous."""
    t, heads, d = q.shape
    kv_heads, dv = v.shape[1], v.shape[2]
    if k.shape != (t, kv_heads, d) or v.shape[0] != t or cos.shape != sin.shape or cos.shape[-1] > d:
        raise ValueError(f"q/k/v/rotary shapes do not line up: {q.shape}, {k.shape}, {v.shape}, {cos.shape}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape[2:] != (kv_heads, d):
        raise ValueError("the KV caches must be contiguous [blocks, block_size, Hk, D]")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    cos, sin = (c if c.stride(-1) == 1 else c.contiguous() for c in (cos, sin))
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((t, heads, d), dtype=q.dtype, device=q.device)
    half = cos.shape[-1] // 2
    if t:
        _qk_norm_rope_store_kernel[(t, heads + kv_heads)](
            q, k, v, q_weight, k_weight, out, k_cache, v_cache, slot_mapping.to(device=q.device), cos, sin,
            eps, offset, heads, kv_heads, d, dv, half, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), cos.stride(0), BLOCK=triton.next_power_of_2(d),
            BHALF=triton.next_power_of_2(max(half, 1)), BLOCK_V=triton.next_power_of_2(dv),
            SAT=fp8_max(k_cache.dtype), num_warps=2,
        )  # fmt: skip
    return out
