"""Rotary position embedding applied in place: `apply_rotary_` (NeoX halves layout, partial rotary)."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def apply_rotary_(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The Triton kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("rotary", "triton", x).apply_rotary_(x, cos, sin)
