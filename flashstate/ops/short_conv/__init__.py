"""Short causal depthwise conv with pooled conv states: `causal_conv1d`."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def causal_conv1d(x: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("short_conv", "triton", x).causal_conv1d(x, *args, **kwargs)
