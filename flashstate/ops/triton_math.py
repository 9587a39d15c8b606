"""Elementwise math shared by the Triton kernels (inlined into each)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(x):
    """log(1 + eˣ) as torch's softplus gives it: x itself above 20."""
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
