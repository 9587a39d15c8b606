"""Fused RMSNorm kernels for CUDA (one program per row, or per several short rows; fp32 inside, one cast
out):

    rms_norm(x, w, eps, offset)        y = x / rms(x) · (offset + w)
    gated_rms_norm(x, z, w, eps)       y = w · x / rms(x) · silu(z)
    add_rms_norm(x, r, w, eps, offset) s = x + r (rounded to x's dtype);  returns (rms_norm(s), s)

`offset` = 1 gives Qwen3-Next's zero-centred norm. The torch forms in the model files are the
reference; these match them to bf16 rounding (the torch forms round the normalised x to x's dtype
once more before the weight in some families).

Inputs may be strided views (a slice of a wider projection output): each is read as rows of
[..., H, N] with any stride for the leading dims and for H, as long as N is contiguous; the outputs are
contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    z_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    n_rows,
    n_cols,
    heads,
    stride_x_row,
    stride_x_head,
    stride_z_row,
    stride_z_head,
    stride_r_row,
    stride_r_head,
    eps,
    offset,
    GATED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # program p: rows [p·ROWS, (p+1)·ROWS) of the flat [n_rows, n_cols] output; flat row m is head
    # m % heads of input row m // heads
    m = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row, head = m // heads, m % heads
    cols = tl.arange(0, BLOCK)
    mask = (m < n_rows)[:, None] & (cols < n_cols)[None, :]
    out = m[:, None] * n_cols + cols[None, :]
    x = tl.load(
        x_ptr + (row * stride_x_row + head * stride_x_head)[:, None] + cols[None, :], mask=mask, other=0.0
    )
    if RESIDUAL:
        r = tl.load(
            r_ptr + (row * stride_r_row + head * stride_r_head)[:, None] + cols[None, :], mask=mask, other=0.0
        )
        x = (x.to(tl.float32) + r.to(tl.float32)).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + out, x, mask=mask)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * (w + offset)[None, :]
    if GATED:
        z = tl.load(
            z_ptr + (row * stride_z_row + head * stride_z_head)[:, None] + cols[None, :], mask=mask, other=0.0
        )
        z = z.to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rows(t: Tensor, n: int) -> Tensor:
    """t as [rows, heads, n] without a copy when its strides allow it (heads = 1 for a 1-D/2-D t)."""
    t3 = t.unsqueeze(0) if t.dim() == 1 else t
    if t3.dim() == 2:
        t3 = t3.unsqueeze(1)
    else:
        try:
            t3 = t3.view(-1, t3.shape[-2], n)
        except RuntimeError:
            t3 = t3.reshape(-1, t3.shape[-2], n)
    return t3 if t3.stride(-1) == 1 else t3.contiguous()


def _launch(
    x: Tensor, z: Tensor | None, r: Tensor | None, weight: Tensor, eps: float, offset: float
) -> tuple[Tensor, Tensor | None]:
    shape, n = x.shape, x.shape[-1]
    x3 = _rows(x, n)
    z3 = x3 if z is None else _rows(z, n)
    r3 = x3 if r is None else _rows(r, n)
    if z3.shape != x3.shape or r3.shape != x3.shape:
        raise ValueError(f"norm inputs of shapes {tuple(x.shape)} do not line up")
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    s = torch.empty(shape, dtype=x.dtype, device=x.device) if r is not None else None
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block = triton.next_power_of_2(n)
        per_program = max(2048 // block, 1)  # short rows (per-head norms) share a program
        _rms_norm_kernel[(triton.cdiv(rows, per_program),)](
            x3,
            z3,
            r3,
            weight,
            y,
            y if s is None else s,
            rows,
            n,
            x3.shape[1],
            x3.stride(0),
            x3.stride(1),
            z3.stride(0),
            z3.stride(1),
            r3.stride(0),
            r3.stride(1),
            eps,
            offset,
            GATED=z is not None,
            RESIDUAL=r is not None,
            ROWS=per_program,
            BLOCK=block,
            num_warps=min(max(block * per_program // 256, 1), 8),
        )
    return y, s


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    return _launch(x, None, None, weight, eps, offset)[0]


def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _launch(x, z, None, weight, eps, 0.0)[0]


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is rounded to x's dtype before the norm."""
    y, s = _launch(x, None, residual, weight, eps, offset)
    assert s is not None
    return y, s
