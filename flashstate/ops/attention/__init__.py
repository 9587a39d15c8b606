"""Paged attention: `paged_attention`, `store_kv`.

On CUDA, a batch of fresh prompts only (every span ≥ SDPA_MIN_SPAN new tokens, none over a cached
prefix) with head dims up to 256 goes through torch's fused SDPA (cuDNN / FlashAttention: faster than our
Triton kernel on long spans); every other batch (decodes, chunks over a prefix, MLA's latent heads) goes
through the Triton kernel, which reads the pool in place and is CUDA-graph safe. The oracle serves CPU
tensors."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend, gpu_kernels

SDPA_MIN_SPAN = 256
SDPA_MAX_HEAD_DIM = 256  # cuDNN / FlashAttention; MLA's latent heads (576 / 512) take the Triton kernel


def fresh_prefill(
    q: Tensor, cu_seqlens: Tensor, context_lens: Tensor, spans: tuple[int, bool] | None = None
) -> bool:
    """CUDA, and every span is a whole prompt of at least SDPA_MIN_SPAN tokens (no cached prefix): what
    torch's fused SDPA serves best. `spans` (ForwardMetadata.spans) answers on the host; without it, one
    host sync, for long batches only (decode never gets there)."""
    if not gpu_kernels(q) or q.shape[0] < SDPA_MIN_SPAN * context_lens.numel():
        return False
    if spans is not None:
        return spans[0] >= SDPA_MIN_SPAN and spans[1]
    spans = cu_seqlens.diff()
    return bool(((spans >= SDPA_MIN_SPAN) & (spans == context_lens)).all())


def long_spans(q: Tensor, cu_seqlens: Tensor, spans: tuple[int, bool] | None = None) -> bool:
    """CUDA, and every span brings at least SDPA_MIN_SPAN new tokens (over a cached prefix or not): a
    prefill batch that fused SDPA serves better than the paged kernel when K/V can be laid out per head
    (MLA expands its latents). From `spans` on the host; without it, one host sync, for long batches only."""
    if not gpu_kernels(q) or q.shape[0] < SDPA_MIN_SPAN * (cu_seqlens.numel() - 1):
        return False
    if spans is not None:
        return spans[0] >= SDPA_MIN_SPAN
    return bool((cu_seqlens.diff() >= SDPA_MIN_SPAN).all())


def paged_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, spans: tuple[int, bool] | None = None, **kwargs
):
    """Same contract as naive.paged_attention; `spans`: ForwardMetadata.spans, to choose without a sync."""
    fused_dims = max(q.shape[-1], v_cache.shape[-1]) <= SDPA_MAX_HEAD_DIM
    if fused_dims and fresh_prefill(q, kwargs["cu_seqlens"], kwargs["context_lens"], spans):
        return backend("attention", "sdpa", q).paged_attention(q, k_cache, v_cache, **kwargs)
    return backend("attention", "triton", q).paged_attention(q, k_cache, v_cache, **kwargs)


def span_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float) -> Tensor:
    """One sequence's new queries [L, H, D] over its whole context k [C, H, D], v [C, H, Dv] (no cache;
    causal, the queries at the context's end): torch's SDPA, fused on CUDA. Returns [L, H, Dv]."""
    from flashstate.ops.attention.sdpa import span_attention as sdpa_span

    return sdpa_span(q, k, v, scale=scale)


def store_kv(k: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("attention", "triton", k).store_kv(k, *args, **kwargs)
