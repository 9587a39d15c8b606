"""Prefill attention through torch's fused SDPA kernels (FlashAttention on CUDA), reading K/V from the
paged pool: each sequence's context is gathered from its blocks into one contiguous span, and its new
queries attend with a lower-right causal mask (query i of L sits at context position ctx - L + i).

One SDPA call per sequence; prefill batches hold few sequences, and the host reads cu_seqlens, so this
path is not for CUDA graphs (decode uses the Triton kernel).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    cu_seqlens: Tensor,
    context_lens: Tensor,
    block_tables: Tensor,
    scale: float,
) -> Tensor:
    """Same contract as ops.attention.naive.paged_attention."""
    block_size = k_cache.shape[1]
    hq, hkv = q.shape[1], k_cache.shape[2]
    out = q.new_empty((q.shape[0], hq, v_cache.shape[-1]))
    bounds = cu_seqlens.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        table = block_tables[i, : -(-ctx // block_size)]
        k = k_cache[table].flatten(0, 1)[:ctx].to(q.dtype).transpose(0, 1)  # [Hkv, ctx, D]
        v = v_cache[table].flatten(0, 1)[:ctx].to(q.dtype).transpose(0, 1)
        if hkv != hq:
            k, v = k.repeat_interleave(hq // hkv, dim=0), v.repeat_interleave(hq // hkv, dim=0)
        qi = q[start:end].transpose(0, 1)  # [Hq, L, D]
        n = end - start
        if n == ctx:
            o = F.scaled_dot_product_attention(qi[None], k[None], v[None], is_causal=True, scale=scale)
        else:
            mask = causal_lower_right(n, ctx)
            o = F.scaled_dot_product_attention(qi[None], k[None], v[None], attn_mask=mask, scale=scale)
        out[start:end] = o[0].transpose(0, 1)
    return out
