"""Mamba2 state-space duality (SSD): `chunk_ssd` (prefill) and `fused_recurrent_ssd` (decode)."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def chunk_ssd(x: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("ssd", "fla", x).chunk_ssd(x, *args, **kwargs)


def fused_recurrent_ssd(x: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("ssd", "fla", x).fused_recurrent_ssd(x, *args, **kwargs)
