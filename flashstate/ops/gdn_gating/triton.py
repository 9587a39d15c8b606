"""Gated DeltaNet's gates on the GPU in one launch (the torch form is six elementwise kernels, which
weigh in a launch-bound decode step). Same contract as `naive.gdn_gating`; fp32 inside. softplus follows
torch's (x above 20 passes through) with log(1 + eˣ) for log1p: equal to within one fp32 ulp of 1."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.triton_math import softplus


@triton.jit
def _gdn_gating_kernel(
    a,
    b,
    A_log,
    dt_bias,
    g,
    beta,
    T,
    HV,
    stride_a,
    stride_b,
    BT: tl.constexpr,
    BH: tl.constexpr,  # noqa: N803
):
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    h = tl.arange(0, BH)
    h_ok = h < HV
    m = (t < T)[:, None] & h_ok[None, :]
    av = tl.load(a + t[:, None] * stride_a + h[None, :], mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b + t[:, None] * stride_b + h[None, :], mask=m, other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(A_log + h, mask=h_ok, other=0.0).to(tl.float32))
    x = av + tl.load(dt_bias + h, mask=h_ok, other=0.0).to(tl.float32)[None, :]
    out = t[:, None] * HV + h[None, :]
    tl.store(g + out, -decay[None, :] * softplus(x), mask=m)
    tl.store(beta + out, tl.sigmoid(bv).to(beta.dtype.element_ty), mask=m)


def gdn_gating(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:  # noqa: N803
    """a, b: [T, HV] (rows may be strided, heads contiguous); A_log, dt_bias: [HV]."""
    if a.shape != b.shape or a.dim() != 2 or A_log.shape != (a.shape[1],) or dt_bias.shape != A_log.shape:
        shapes = f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(A_log.shape)}, {tuple(dt_bias.shape)}"
        raise ValueError(f"gates: a, b [T, HV] and A_log, dt_bias [HV]; got {shapes}")
    if a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(1) != 1:
        b = b.contiguous()
    t, hv = a.shape
    g = torch.empty((t, hv), dtype=torch.float32, device=a.device)
    beta = torch.empty((t, hv), dtype=b.dtype, device=b.device)
    if t:
        bh = triton.next_power_of_2(hv)
        bt = max(1, min(64, 4096 // bh, triton.next_power_of_2(t)))
        _gdn_gating_kernel[(triton.cdiv(t, bt),)](
            a, b, A_log, dt_bias, g, beta, t, hv, a.stride(0), b.stride(0), BT=bt, BH=bh, num_warps=4
        )
    return g, beta
