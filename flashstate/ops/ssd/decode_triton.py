"""One-token-per-sequence SSD step in Triton, reading and writing the pool slot in place.

Per program (sequence i, head h, block of head_dim rows), with S the slot's [P, N] state:
    Δ = clamp(softplus(dt + dt_bias), lo, hi);  S ← exp(Δ A_h) S + (Δ x) ⊗ B;  y = S C + D_h x
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.triton_math import softplus


@triton.jit
def _ssd_decode_kernel(
    x,
    dt,
    A,
    B,
    C,
    D,
    dt_bias,
    y,
    pool,
    indices,
    has_initial,
    dt_lo,
    dt_hi,
    stride_x_t,
    stride_x_h,
    stride_dt_t,
    stride_b_t,
    stride_b_g,
    stride_c_t,
    stride_c_g,
    HEADS_PER_GROUP: tl.constexpr,
    H: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    rows = tl.program_id(2) * BP + tl.arange(0, BP)
    cols = tl.arange(0, BN)
    row_ok, col_ok = rows < P, cols < N
    grp = h // HEADS_PER_GROUP

    d = tl.load(dt + i * stride_dt_t + h).to(tl.float32)
    if HAS_BIAS:
        d += tl.load(dt_bias + h).to(tl.float32)
    if SOFTPLUS:
        d = softplus(d)
    d = tl.minimum(tl.maximum(d, dt_lo), dt_hi)
    decay = tl.exp(d * tl.load(A + h).to(tl.float32))

    xv = tl.load(x + i * stride_x_t + h * stride_x_h + rows, mask=row_ok, other=0.0).to(tl.float32)
    bv = tl.load(B + i * stride_b_t + grp * stride_b_g + cols, mask=col_ok, other=0.0).to(tl.float32)
    cv = tl.load(C + i * stride_c_t + grp * stride_c_g + cols, mask=col_ok, other=0.0).to(tl.float32)

    slot = tl.load(indices + i).to(tl.int64)
    ptrs = pool + ((slot * H + h) * P + rows[:, None]) * N + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    state = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    state = tl.where(tl.load(has_initial + i) != 0, state, 0.0)
    state = decay * state + (d * xv)[:, None] * bv[None, :]
    tl.store(ptrs, state.to(pool.dtype.element_ty), mask=mask)

    out = tl.sum(state * cv[None, :], axis=1)
    if HAS_D:
        out += tl.load(D + h).to(tl.float32) * xv
    tl.store(y + (i * H + h) * P + rows, out.to(y.dtype.element_ty), mask=row_ok)


def ssd_decode_in_place(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    *,
    dt_bias: Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
) -> Tensor:
    """x: [1, N, H, P] (one token per sequence); dt: [1, N, H]; B, C: [1, N, G, Ns];
    state_pool: [S, H, P, Ns], contiguous. Returns y: [1, N, H, P] in x's dtype."""
    _, n, heads, p = x.shape
    groups, ns = B.shape[2], B.shape[3]
    if not state_pool.is_contiguous():
        raise ValueError("the SSD decode kernel needs a contiguous state pool")
    y = torch.empty((1, n, heads, p), dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    x0, dt0, b0, c0 = x[0], dt[0], B[0], C[0]
    bp = min(triton.next_power_of_2(p), 32)
    grid = (n, heads, triton.cdiv(p, bp))
    _ssd_decode_kernel[grid](
        x0,
        dt0,
        A,
        b0,
        c0,
        A if D is None else D,
        A if dt_bias is None else dt_bias,
        y,
        state_pool,
        state_indices.to(x.device),
        has_initial_state.to(x.device),
        float(dt_limit[0]),
        float(dt_limit[1]),
        x0.stride(0),
        x0.stride(1),
        dt0.stride(0),
        b0.stride(0),
        b0.stride(1),
        c0.stride(0),
        c0.stride(1),
        HEADS_PER_GROUP=heads // groups,
        H=heads,
        P=p,
        N=ns,
        BP=bp,
        BN=triton.next_power_of_2(ns),
        HAS_D=D is not None,
        HAS_BIAS=dt_bias is not None,
        SOFTPLUS=dt_softplus,
    )
    return y
