"""Rotary position embedding on the GPU, in place: one program per (token, block of heads), fp32 inside,
one cast out. Same contract as `naive.apply_rotary_`; x may be strided over tokens and heads."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rotary_kernel(
    x, cos, sin, heads, half, stride_x_t, stride_x_h, stride_c_t, BHALF: tl.constexpr, BH: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    i = tl.arange(0, BHALF)
    c = tl.load(cos + t * stride_c_t + i, mask=i < half, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin + t * stride_c_t + i, mask=i < half, other=0.0).to(tl.float32)[None, :]
    at = x + t * stride_x_t + h.to(tl.int64)[:, None] * stride_x_h + i[None, :]
    mask = (h < heads)[:, None] & (i < half)[None, :]
    x1 = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(at + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(at, (x1 * c - x2 * s).to(x.dtype.element_ty), mask=mask)
    tl.store(at + half, (x2 * c + x1 * s).to(x.dtype.element_ty), mask=mask)


def apply_rotary_(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, H, D]; cos, sin: [T, R] (R ≤ D, even). Rotates x[..., :R] in place."""
    t, heads = x.shape[0], x.shape[1]
    half = cos.shape[-1] // 2
    if x.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError("rotary: x, cos and sin need contiguous last dims and cos/sin one layout")
    if t and heads:
        bhalf = triton.next_power_of_2(half)
        bh = min(triton.next_power_of_2(heads), max(1, 2048 // bhalf))
        _rotary_kernel[(t, triton.cdiv(heads, bh))](
            x, cos, sin, heads, half, x.stride(0), x.stride(1), cos.stride(0), BHALF=bhalf, BH=bh, num_warps=4
        )
    return x
