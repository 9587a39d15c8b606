"""FP8 block-quantized linear in plain torch (the oracle of the GPU kernel): dequantize, then a dense
matmul in the activation's dtype."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.fp8.block_quant import dequantize_block


def fp8_linear(x: Tensor, weight: Tensor, weight_scale_inv: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ W.T (+ bias), W [N, K] = `weight` (float8_e4m3fn) · `weight_scale_inv` per 128×128
    block (fp32 [ceil(N/128), ceil(K/128)]); the result is in x's dtype."""
    return F.linear(x, dequantize_block(weight, weight_scale_inv, x.dtype), bias)
