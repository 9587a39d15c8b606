"""Prefill attention through torch's fused SDPA kernels (FlashAttention on CUDA), reading K/V from the
paged pool: each sequence's context is gathered from its blocks into one contiguous span, and its new
queries attend with a lower-right causal mask (query i of L sits at context position ctx - L + i).

Grouped K/V heads go into SDPA as they are (`enable_gqa`) when torch picks the same fused backend for
them as for K/V repeated to q's heads (decided once per shape class; `FLASHSTATE_SDPA_GQA=0` always
repeats); otherwise they are repeated first.

One SDPA call per sequence; prefill batches hold few sequences, and the host reads cu_seqlens, so this
path is not for CUDA graphs (decode uses the Triton kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from flashstate import envs
from flashstate.ops.attention.kv_cast import gather_blocks

_GQA_CHOICE: dict[tuple, bool] = {}


def gqa_in_kernel(q: Tensor, k: Tensor, v: Tensor, scale: float) -> bool:
    """q: [1, Hq, L, D], k/v: [1, Hkv, L, D/Dv] (causal, L = context): whether SDPA takes the grouped
    heads directly and still runs the backend it picks for repeated heads."""
    if not envs.FLASHSTATE_SDPA_GQA:
        return False
    key = (q.device, q.dtype, q.shape[1], k.shape[1], q.shape[-1], v.shape[-1])
    if key not in _GQA_CHOICE:
        n, r = min(q.shape[2], 64), q.shape[1] // k.shape[1]
        qs, ks, vs = q[:, :, :n], k[:, :, :n], v[:, :, :n]
        try:
            grouped = torch._fused_sdp_choice(qs, ks, vs, None, 0.0, True, scale=scale, enable_gqa=True)
            repeated = torch._fused_sdp_choice(
                qs, ks.repeat_interleave(r, dim=1), vs.repeat_interleave(r, dim=1), None, 0.0, True,
                scale=scale,
            )  # fmt: skip
            _GQA_CHOICE[key] = grouped == repeated
        except (AttributeError, RuntimeError, TypeError):  # a torch without the choice or enable_gqa
            _GQA_CHOICE[key] = False
    return _GQA_CHOICE[key]


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
    """Same contract as ops.attention.naive.paged_attention (fp8 caches read upcast to q's dtype)."""
    block_size = k_cache.shape[1]
    hq, hkv = q.shape[1], k_cache.shape[2]
    outs = []
    bounds = cu_seqlens.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        table = block_tables[i, : -(-ctx // block_size)]
        k = gather_blocks(k_cache, table).flatten(0, 1)[:ctx].to(q.dtype)  # [ctx, Hkv, D]
        v = gather_blocks(v_cache, table).flatten(0, 1)[:ctx].to(q.dtype)
        qi = q[start:end]
        heads = tuple(x.transpose(0, 1)[None] for x in (qi, k, v))  # [1, H, L / ctx, D]
        if end - start == ctx and hkv != hq and gqa_in_kernel(*heads, scale):
            o = F.scaled_dot_product_attention(*heads, is_causal=True, scale=scale, enable_gqa=True)
            outs.append(o[0].transpose(0, 1))  # [L, Hq, Dv]; dense when the kernel wrote in q's layout
            continue
        if hkv != hq:
            k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        outs.append(span_attention(qi, k, v, scale=scale))
    return outs[0].contiguous() if len(outs) == 1 else torch.cat(outs)


def span_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float) -> Tensor:
    """One sequence's L new queries [L, H, D] at the end of its context k [C, H, D], v [C, H, Dv] (C ≥ L,
    causal: query i sits at position C − L + i) → [L, H, Dv]. A narrower V (MLA: Dv < D) is zero-padded to
    D and the output cut back: FlashAttention takes only equal head dims, and the other kernels are slower."""
    dv = v.shape[-1]
    if dv < q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - dv))
    qi, ki, vi = (x.transpose(0, 1)[None] for x in (q, k, v))
    n, ctx = q.shape[0], k.shape[0]
    if n == ctx:
        o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale)
    else:
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=causal_lower_right(n, ctx), scale=scale)
    return o[0].transpose(0, 1)[..., :dv]
