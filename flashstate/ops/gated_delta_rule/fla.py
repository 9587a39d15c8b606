"""Gated delta rule on the GPU through flash-linear-attention, over pooled states with in-chunk export.

Same arguments and results as `naive.py`. The chunked form runs FLA's stages itself (cumsum → UT
transform → chunk states → output) so that the chunk start states `h` and the written values stay at hand:
exports are those states advanced to their tokens (`states_at_exports`), with no second pass.
FLA always works in chunks of 64; the `chunk_size` argument only shapes the oracle's arithmetic.
"""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.chunking import FLA_CHUNK
from flashstate.ops.fla_chunked import delta_rule_inputs, export_and_scatter, varlen_setup
from flashstate.ops.pooled_triton import decode_delta_rule_in_place


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    chunk_indices: Tensor | None = None,
    export_token_ids: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """q, k: [1, T, Hk, K]; v: [1, T, HV, V]; g, beta: [1, T, HV]; state_pool: [S, HV, K, V].
    Returns o: [1, T, HV, V] (v's dtype) and the exported states [E, HV, K, V]."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra

    del chunk_size
    if q.shape[0] != 1:
        raise ValueError(f"varlen ops take a flat batch [1, T, ...], got batch {q.shape[0]}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, beta = delta_rule_inputs(q, k, v, beta, use_qk_l2norm_in_kernel)
    cu, chunks, g_cum, h0 = varlen_setup(
        g, cu_seqlens, state_pool, state_indices, has_initial_state, chunk_indices
    )
    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=k, v=v, g=g_cum, beta=beta, cu_seqlens=cu, chunk_size=FLA_CHUNK, chunk_indices=chunks
    )
    h, v_new, final = chunk_gated_delta_rule_fwd_h(
        k=k,
        w=w,
        u=u,
        g=g_cum,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
        chunk_indices=chunks,
        chunk_size=FLA_CHUNK,
    )
    o = chunk_fwd_o(
        q=q,
        k=k,
        v=v_new,
        h=h,
        g=g_cum,
        scale=scale,
        cu_seqlens=cu,
        chunk_size=FLA_CHUNK,
        chunk_indices=chunks,
    )
    exported = export_and_scatter(h, k, v_new, g_cum, cu, export_token_ids, state_pool, state_indices, final)
    return o.to(v.dtype), exported


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    export_token_ids: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """The decode form. A batch of one token per sequence (N == T) updates the pool slots in place;
    any other batch takes the chunked path, which computes the same function."""
    n, t = cu_seqlens.shape[0] - 1, q.shape[1]
    if n != t:
        return chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            scale=scale,
            state_pool=state_pool,
            state_indices=state_indices,
            has_initial_state=has_initial_state,
            cu_seqlens=cu_seqlens,
            export_token_ids=export_token_ids,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            chunk_size=chunk_size,
        )
    # per-channel decay with every channel equal: the KDA decode kernel computes this rule exactly
    gk = g.float()[..., None].expand(*g.shape, q.shape[-1])
    return decode_delta_rule_in_place(
        q,
        k,
        v,
        gk,
        beta,
        scale=scale,
        state_pool=state_pool,
        state_indices=state_indices,
        has_initial_state=has_initial_state,
        export_token_ids=export_token_ids,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
