"""Fused RMSNorm kernels for CUDA (one program per row, fp32 inside, one cast out):

    rms_norm(x, w, eps, offset)        y = x / rms(x) · (offset + w)
    gated_rms_norm(x, z, w, eps)       y = w · x / rms(x) · silu(z)

`offset` = 1 gives Qwen3-Next's zero-centred norm. The torch forms in the model files are the
reference; these match them to bf16 rounding (the torch forms round the normalised x to x's dtype
once more before the weight in some families).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rms_norm_kernel(
    x_ptr, z_ptr, w_ptr, y_ptr, n_cols, eps, offset, GATED: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * (w + offset)
    if GATED:
        z = tl.load(z_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x: Tensor, z: Tensor | None, weight: Tensor, eps: float, offset: float) -> Tensor:
    shape, n = x.shape, x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    z2 = x2 if z is None else z.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            z2,
            weight,
            y,
            n,
            eps,
            offset,
            GATED=z is not None,
            BLOCK=block,
            num_warps=min(max(block // 256, 1), 8),
        )
    return y.reshape(shape)


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    return _launch(x, None, weight, eps, offset)


def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _launch(x, z, weight, eps, 0.0)
