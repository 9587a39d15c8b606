"""Gated activations: `silu_mul` (SwiGLU's silu(gate) · up over one fused gate|up projection) and
`sigmoid_mul` (attention's output gate)."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def silu_mul(gate_up: Tensor) -> Tensor:
    """The Triton kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("activation", "triton", gate_up).silu_mul(gate_up)


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    """The Triton kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("activation", "triton", x).sigmoid_mul(x, gate)
