"""SwiGLU's gate on the GPU: one pass over the fused gate|up projection output, fp32 inside, one cast out.
Same contract as `naive.silu_mul`; rows may be strided (the last dim must be contiguous)."""

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
