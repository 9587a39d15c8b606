"""Mamba2 SSD on the GPU: prefill through flash-linear-attention's simple-GLA chunk stages (SSD is linear
attention with a scalar per-head decay), decode through a Triton kernel on the pool in place.

The mapping, per head h of group g: q = C_g, k = B_g, v = Δ·x, log decay = Δ·A_h, scale 1, and
y = o + D_h·x. The pool keeps states as [H, P, N] (head_dim × d_state), which is FLA's value-first
layout. Exports are chunk start states advanced to their tokens (`states_at_exports`). FLA works in
chunks of 64 whatever `chunk_size` says.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flashstate.ops.chunking import FLA_CHUNK
from flashstate.ops.fla_chunked import export_and_scatter, varlen_setup
from flashstate.ops.pooled import decode_exports
from flashstate.ops.ssd.decode_triton import ssd_decode_in_place
from flashstate.ops.ssd.naive import _delta


def chunk_ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    chunk_indices: Tensor | None = None,
    real_tokens: Tensor | None = None,
    export_token_ids: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """x: [1, T, H, P]; dt: [1, T, H]; A: [H]; B, C: [1, T, G, N]; D: [H]; state_pool: [S, H, P, N].
    Returns y: [1, T, H, P] (x's dtype) and the exported states [E, H, P, N]."""
    from fla.ops.common.chunk_o import chunk_fwd_o

    del chunk_size
    if x.shape[0] != 1:
        raise ValueError(f"varlen inputs must have batch size 1, got {x.shape[0]}")
    heads, groups = x.shape[2], B.shape[2]
    if heads % groups:
        raise ValueError(f"{heads} heads cannot be split into {groups} groups")
    delta = _delta(dt, dt_bias, dt_softplus, dt_limit)  # [1, T, H] fp32
    if real_tokens is not None:  # pad tokens: a step of zero length (no decay, no input)
        delta = torch.where(real_tokens[None, :, None], delta, 0.0)
    v = (x.float() * delta[..., None]).to(x.dtype)
    k = B.repeat_interleave(heads // groups, dim=2).to(x.dtype)
    q = C.repeat_interleave(heads // groups, dim=2).to(x.dtype)
    cu, chunks, g_cum, h0 = varlen_setup(
        delta * A.float(), cu_seqlens, state_pool, state_indices, has_initial_state, chunk_indices
    )
    h, final = _chunk_states(k, v, g_cum, h0, cu, chunks)
    y = chunk_fwd_o(
        q=q,
        k=k,
        v=v,
        h=h,
        g=g_cum,
        scale=1.0,
        state_v_first=True,
        cu_seqlens=cu,
        chunk_size=FLA_CHUNK,
        chunk_indices=chunks,
    )
    if D is not None:
        y = y.float() + D.float()[:, None] * x.float()
    exported = export_and_scatter(
        h, k, v, g_cum, cu, export_token_ids, state_pool, state_indices, final, v_first=True
    )
    return y.to(x.dtype), exported


def _chunk_states(
    k: Tensor, v: Tensor, g_cum: Tensor, h0: Tensor, cu: Tensor, chunks: Tensor
) -> tuple[Tensor, Tensor]:
    """FLA's `chunk_fwd_h` (simple-GLA chunk start states, value-first, fp32 final states) without its host
    read: it sizes the states by `split_offsets[-1].item()`, a device wait that a CUDA graph cannot capture
    (the mixed-step graphs), where the chunk list's length is the same count, known on the host.
    Returns h [1, NT, H, V, K] (k's dtype) and the final states [N, H, V, K] fp32."""
    import triton
    from fla.ops.common.chunk_h import chunk_fwd_kernel_h
    from fla.ops.utils.index import prepare_chunk_offsets

    _, _, heads, dk, dv = *k.shape, v.shape[-1]
    n = cu.shape[0] - 1
    h = k.new_empty(1, chunks.shape[0], heads, dv, dk)
    final = k.new_empty(n, heads, dv, dk, dtype=torch.float)

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(dk, meta["BK"]) * triton.cdiv(dv, meta["BV"]) * n * heads,)

    chunk_fwd_kernel_h[grid](
        k=k, v=v, h=h, g=g_cum, g_gamma=None, gk=None, gv=None, h0=h0, ht=final, cu_seqlens=cu,
        split_offsets=prepare_chunk_offsets(cu, FLA_CHUNK), T=k.shape[1], H=heads, K=dk, V=dv,
        BT=FLA_CHUNK, BS=FLA_CHUNK, USE_G=True, USE_G_GAMMA=False, USE_GK=False, USE_GV=False,
        STATE_V_FIRST=True,
    )  # fmt: skip
    return h, final


def fused_recurrent_ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    export_token_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The decode form. A batch of one token per sequence (N == T) updates the pool slots in place;
    any other batch takes the chunked path, which computes the same function."""
    kwargs = dict(
        dt_bias=dt_bias,
        dt_softplus=dt_softplus,
        dt_limit=dt_limit,
        state_pool=state_pool,
        state_indices=state_indices,
        has_initial_state=has_initial_state,
    )
    if cu_seqlens.shape[0] - 1 != x.shape[1]:
        return chunk_ssd(
            x, dt, A, B, C, D, cu_seqlens=cu_seqlens, export_token_ids=export_token_ids, **kwargs
        )
    y = ssd_decode_in_place(x, dt, A, B, C, D, **kwargs)
    return y, decode_exports(state_pool, state_indices, export_token_ids)
