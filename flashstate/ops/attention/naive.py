"""Paged attention over a varlen batch (the oracle): new tokens attend to cached prefix + themselves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.attention.kv_cast import to_kv_cache


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write new keys/values into the paged pool.

    k: [T, Hkv, D]; k_cache: [num_blocks, block_size, Hkv, D]; cast to the cache's dtype (kv_cast.py)."""
    block_size = k_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, offsets] = to_kv_cache(k, k_cache.dtype)
    v_cache[blocks, offsets] = to_kv_cache(v, v_cache.dtype)


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
    """Causal GQA attention reading K/V through block tables.

    q: [T, Hq, D]; k_cache: [num_blocks, block_size, Hkv, D]; v_cache: [num_blocks, block_size, Hkv, Dv];
    the span of sequence i holds its last `cu_seqlens[i+1] - cu_seqlens[i]` positions of
    `context_lens[i]`. The caches may be fp8 (read upcast to q's dtype). Returns [T, Hq, Dv].
    """
    block_size = k_cache.shape[1]
    hq, hkv = q.shape[1], k_cache.shape[2]
    out = q.new_empty((q.shape[0], hq, v_cache.shape[-1]))
    bounds = cu_seqlens.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        n_blocks = -(-ctx // block_size)
        table = block_tables[i, :n_blocks]
        k = k_cache[table].flatten(0, 1)[:ctx].to(q.dtype)  # [ctx, Hkv, D]
        v = v_cache[table].flatten(0, 1)[:ctx].to(q.dtype)
        qi = q[start:end]
        q_pos = torch.arange(ctx - (end - start), ctx, device=q.device)
        mask = q_pos[:, None] >= torch.arange(ctx, device=q.device)[None, :]  # [L, ctx]
        o = F.scaled_dot_product_attention(
            qi.transpose(0, 1),
            k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1),
            v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1),
            attn_mask=mask,
            scale=scale,
        )
        out[start:end] = o.transpose(0, 1)
    return out
