"""Paged attention: `paged_attention`, `store_kv`.

On CUDA, a batch whose every span is a long prefill (≥ SDPA_MIN_SPAN new tokens) goes through torch's
fused SDPA (FlashAttention: faster than our Triton kernel on long spans); any batch with short spans
(decodes, small chunks) goes through the Triton kernel, which reads the pool in place and is
CUDA-graph safe. The oracle serves CPU tensors."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend

SDPA_MIN_SPAN = 256


def paged_attention(q: Tensor, *args, **kwargs):
    """Same contract as naive.paged_attention."""
    if q.is_cuda and q.shape[0] >= SDPA_MIN_SPAN * kwargs["context_lens"].numel():
        spans = kwargs["cu_seqlens"].diff()
        if int(spans.min()) >= SDPA_MIN_SPAN:  # a host sync: prefill only (decode never gets here)
            return backend("attention", "sdpa", q).paged_attention(q, *args, **kwargs)
    return backend("attention", "triton", q).paged_attention(q, *args, **kwargs)


def store_kv(k: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("attention", "triton", k).store_kv(k, *args, **kwargs)
