"""Gated DeltaNet's decode step in one Triton kernel: the gates, the state update in its pool slot and the
output, for one token per sequence. It replaces five launches of the unfused step (the gates, zeroing
fresh slots, widening the decay per channel, clearing the output, the recurrent kernel), which weigh in a
launch-bound decode step.

Per program (sequence i, value head hv, a block of value columns), S the slot's [K, V] fp32 state:
    g = −exp(A_log) · softplus(a + dt_bias);  β = sigmoid(b), rounded to b's dtype as the unfused gates are
    q, k ← l2norm(q), l2norm(k) (optional);  S ← exp(g) · S;  S ← S + k ⊗ β (v − kᵀS);  o = (scale · q)ᵀS
A sequence without an initial state starts from zeros; every load of the slot precedes the store into it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.pooled import decode_exports
from flashstate.ops.triton_math import softplus

BV = 32  # value columns per program


@triton.jit
def _gdn_decode_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,  # noqa: N803
    dt_bias,
    o,
    pool,
    indices,
    has_initial,
    scale,
    stride_q_t,
    stride_k_t,
    stride_v_t,
    stride_a_t,
    stride_b_t,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    h = hv // (HV // H)
    ck = tl.arange(0, BK)
    cv = tl.program_id(2) * BV + tl.arange(0, BV)
    k_ok, v_ok = ck < K, cv < V

    qv = tl.load(q + i * stride_q_t + h * K + ck, mask=k_ok, other=0.0).to(tl.float32)
    kv = tl.load(k + i * stride_k_t + h * K + ck, mask=k_ok, other=0.0).to(tl.float32)
    vv = tl.load(v + i * stride_v_t + hv * V + cv, mask=v_ok, other=0.0).to(tl.float32)
    if L2NORM:
        qv = qv / tl.sqrt(tl.sum(qv * qv) + 1e-6)
        kv = kv / tl.sqrt(tl.sum(kv * kv) + 1e-6)
    qv = qv * scale

    x = tl.load(a + i * stride_a_t + hv).to(tl.float32) + tl.load(dt_bias + hv).to(tl.float32)
    decay = tl.exp(-tl.exp(tl.load(A_log + hv).to(tl.float32)) * softplus(x))
    bv = tl.load(b + i * stride_b_t + hv)
    beta = tl.sigmoid(bv.to(tl.float32)).to(bv.dtype).to(tl.float32)

    slot = tl.load(indices + i).to(tl.int64)
    cell = pool + ((slot * HV + hv) * K + ck[:, None]) * V + cv[None, :]
    mask = k_ok[:, None] & v_ok[None, :]
    state = tl.load(cell, mask=mask, other=0.0)
    state = tl.where(tl.load(has_initial + i) != 0, state, 0.0) * decay
    delta = beta * (vv - tl.sum(state * kv[:, None], axis=0))
    state += kv[:, None] * delta[None, :]
    tl.store(cell, state, mask=mask)
    out = tl.sum(state * qv[:, None], axis=0)
    tl.store(o + (i * HV + hv) * V + cv, out.to(o.dtype.element_ty), mask=v_ok)


def _rows(x: Tensor) -> Tensor:
    """x [N, H, D] with each row's heads contiguous, as the kernel reads it (rows may be strided)."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def decode_gated_delta_rule_in_place(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,  # noqa: N803
    dt_bias: Tensor,
    *,
    scale: float | None = None,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    export_token_ids: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor]:
    """q, k: [1, N, H, K]; v: [1, N, HV, V]; a, b: [N, HV] (the gates' inputs; rows may be strided);
    state_pool: [S, HV, K, V] fp32, contiguous. One token per sequence: sequence i's state is read from and
    written back to slot `state_indices[i]`. Returns o [1, N, HV, V] in v's dtype and the exported states
    (token e's export is its sequence's new state)."""
    _, n, heads, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    if state_pool.dtype != torch.float32 or not state_pool.is_contiguous():
        raise ValueError("the decode kernel keeps fp32 states in a contiguous pool")
    if state_pool.shape[1:] != (hv, dk, dv) or a.shape != (n, hv) or b.shape != (n, hv):
        raise ValueError(
            f"decode shapes: pool {tuple(state_pool.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)} "
            f"for {n} tokens, {hv} value heads of [{dk}, {dv}]"
        )
    q0, k0, v0 = (_rows(x[0]) for x in (q, k, v))
    a0, b0 = (x if x.stride(1) == 1 else x.contiguous() for x in (a, b))
    o = torch.empty((1, n, hv, dv), dtype=v.dtype, device=v.device)
    idx = state_indices.to(device=v.device)
    if n:
        _gdn_decode_kernel[(n, hv, triton.cdiv(dv, BV))](
            q0, k0, v0, a0, b0, A_log, dt_bias, o, state_pool, idx, has_initial_state.to(device=v.device),
            dk**-0.5 if scale is None else scale, q0.stride(0), k0.stride(0), v0.stride(0), a0.stride(0),
            b0.stride(0), H=heads, HV=hv, K=dk, V=dv, BK=triton.next_power_of_2(dk), BV=BV,
            L2NORM=use_qk_l2norm_in_kernel, num_warps=4,
        )  # fmt: skip
    return o, decode_exports(state_pool, idx, export_token_ids)
