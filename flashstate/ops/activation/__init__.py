"""Gated activations of MLPs: `silu_mul` (SwiGLU's silu(gate) · up over one fused gate|up projection)."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def silu_mul(gate_up: Tensor) -> Tensor:
    """The Triton kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("activation", "triton", gate_up).silu_mul(gate_up)
