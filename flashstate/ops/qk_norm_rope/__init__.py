"""Attention's query/key preparation in one pass: per-head RMSNorm of q and k, rotary embedding of their
first dims, and k and v written into the paged KV cache (`qk_norm_rope_store`)."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def qk_norm_rope_store(q: Tensor, *args, **kwargs) -> Tensor:
    """The Triton kernel for CUDA tensors, the naive composite otherwise (same contract)."""
    return backend("qk_norm_rope", "triton", q).qk_norm_rope_store(q, *args, **kwargs)
