"""Kimi Delta Attention (gated delta rule with per-channel decay): `chunk_kda`, `fused_recurrent_kda`."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def chunk_kda(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("kda", "fla", q).chunk_kda(q, *args, **kwargs)


def fused_recurrent_kda(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("kda", "fla", q).fused_recurrent_kda(q, *args, **kwargs)
