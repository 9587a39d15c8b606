"""Paged attention: `paged_attention`, `store_kv`.

On CUDA, a batch of fresh prompts only (every span ≥ SDPA_MIN_SPAN new tokens, none over a cached
prefix) with head dims up to 256 goes through torch's fused SDPA (cuDNN / FlashAttention: faster than our
Triton kernel on long spans); every other batch (decodes, chunks over a prefix, MLA's latent heads) goes
through the Triton kernel, which reads the pool in place and is CUDA-graph safe. The oracle serves CPU
tensors."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend

SDPA_MIN_SPAN = 256
SDPA_MAX_HEAD_DIM = 256  # cuDNN / FlashAttention; MLA's latent heads (576 / 512) take the Triton kernel


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, **kwargs):
    """Same contract as naive.paged_attention."""
    fused_dims = max(q.shape[-1], v_cache.shape[-1]) <= SDPA_MAX_HEAD_DIM
    if q.is_cuda and fused_dims and q.shape[0] >= SDPA_MIN_SPAN * kwargs["context_lens"].numel():
        spans = kwargs["cu_seqlens"].diff()
        fresh = (spans >= SDPA_MIN_SPAN) & (spans == kwargs["context_lens"])
        if bool(fresh.all()):  # one host sync: prefill only (decode never gets here)
            return backend("attention", "sdpa", q).paged_attention(q, k_cache, v_cache, **kwargs)
    return backend("attention", "triton", q).paged_attention(q, k_cache, v_cache, **kwargs)


def store_kv(k: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("attention", "triton", k).store_kv(k, *args, **kwargs)
