"""Gated activations on the GPU, one pass each, fp32 inside, one cast out; same contracts as `naive`:
SwiGLU's gate over the fused gate|up projection output (rows may be strided, the last dim contiguous) and
attention's sigmoid output gate (the gate a strided view of the q projection's output)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _silu_mul_kernel(gate_up, out, n_cols, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gate_up + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * stride_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(out + row * n_cols + cols, y.to(out.dtype.element_ty), mask=mask)


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up: [..., 2I] = [gate | up] → silu(gate) · up: [..., I]."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate|up width must be even, got {gate_up.shape[-1]}")
    n = gate_up.shape[-1] // 2
    flat = gate_up.reshape(-1, 2 * n)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty((*gate_up.shape[:-1], n), dtype=gate_up.dtype, device=gate_up.device)
    if flat.shape[0] and n:
        block = min(triton.next_power_of_2(n), 1024)
        _silu_mul_kernel[(flat.shape[0], triton.cdiv(n, block))](
            flat, out, n, flat.stride(0), BLOCK=block, num_warps=4
        )
    return out


@triton.jit
def _sigmoid_mul_kernel(
    x, gate, out, H, D, stride_x_t, stride_x_h, stride_g_t, stride_g_h, BLOCK: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    xv = tl.load(x + t * stride_x_t + h * stride_x_h + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate + t * stride_g_t + h * stride_g_h + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + (t * H + h) * D + cols, (xv * tl.sigmoid(g)).to(out.dtype.element_ty), mask=mask)


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    """x, gate: [T, H, D] (rows and heads may be strided, the last dim contiguous) → x · sigmoid(gate)."""
    if x.shape != gate.shape or x.dim() != 3:
        raise ValueError(f"sigmoid_mul: x and gate must be one [T, H, D] shape, got {x.shape}, {gate.shape}")
    x, gate = (a if a.stride(-1) == 1 else a.contiguous() for a in (x, gate))
    t, h, d = x.shape
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if x.numel():
        _sigmoid_mul_kernel[(t, h)](
            x, gate, out, h, d, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
            BLOCK=triton.next_power_of_2(d), num_warps=2,
        )  # fmt: skip
    return out
