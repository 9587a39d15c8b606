"""Block-wise FP8 weights (128×128 blocks, float8_e4m3fn + fp32 `weight_scale_inv`, block_quant.py) and
their linear layer: `fp8_linear`, the Triton block-FP8 GEMM on CUDA, dequantize-then-matmul elsewhere."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend

__all__ = ["fp8_linear"]


def fp8_linear(x: Tensor, weight: Tensor, weight_scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ W.T (+ bias) → [..., N] in x's dtype; W [N, K] = `weight` (float8_e4m3fn) times
    `weight_scale_inv` (fp32 [ceil(N/128), ceil(K/128)]) per 128×128 block. On CUDA no step waits on the
    device (CUDA-graph safe)."""
    return backend("fp8", "triton", x).fp8_linear(x, weight, weight_scale_inv, bias)
