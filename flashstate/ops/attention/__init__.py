"""Paged attention: `paged_attention`, `store_kv`."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def paged_attention(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("attention", "triton", q).paged_attention(q, *args, **kwargs)


def store_kv(k: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("attention", "triton", k).store_kv(k, *args, **kwargs)
