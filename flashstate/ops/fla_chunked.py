"""What the FLA-backed chunked passes (gated delta rule, KDA, Mamba2 SSD) share around their own stages:
the varlen set-up (chunk indices, the per-chunk cumulative log2 decay, initial states gathered from the
pool) and the finish (states exported at their tokens from the chunk start states, final states
scattered back to the pool). FLA always works in chunks of FLA_CHUNK tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flashstate.ops.chunking import FLA_CHUNK
from flashstate.ops.pooled import gather_states, scatter_states
from flashstate.ops.pooled_triton import states_at_exports_fused


def varlen_setup(
    log_decay: Tensor,
    cu_seqlens: Tensor,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    chunk_indices: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """→ (cu_seqlens as int64 on the decay's device, FLA's chunk indices, the chunk-local cumulative decay
    in log2 units, the initial states [N, ...] from the pool, zeros where there is none).
    `chunk_indices`: the metadata's (built on the host); without them FLA derives them from the lengths,
    reading them back from the device (a sync)."""
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2
    from fla.ops.utils.index import prepare_chunk_indices

    cu = cu_seqlens.to(device=log_decay.device, dtype=torch.long)
    chunks = prepare_chunk_indices(cu, FLA_CHUNK) if chunk_indices is None else chunk_indices
    g_cum = chunk_local_cumsum(
        log_decay.float().contiguous(),
        chunk_size=FLA_CHUNK,
        scale=RCP_LN2,
        cu_seqlens=cu,
        chunk_indices=chunks,
    )
    return cu, chunks, g_cum, gather_states(state_pool, state_indices, has_initial_state)


def delta_rule_inputs(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, qk_l2norm: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Contiguous q, k, v, beta (FLA views its inputs flat; the models hand in strided slices of one
    projection), q and k L2-normalised when asked."""
    from fla.modules.norm.l2norm import l2norm_fwd

    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    if qk_l2norm:
        q, k = l2norm_fwd(q)[0], l2norm_fwd(k)[0]
    return q, k, v, beta


def export_and_scatter(
    h: Tensor,
    k: Tensor,
    v: Tensor,
    g_cum: Tensor,
    cu: Tensor,
    export_token_ids: Tensor | None,
    state_pool: Tensor,
    state_indices: Tensor,
    final: Tensor,
    v_first: bool = False,
) -> Tensor:
    """The states right after each export token (from the chunk start states h), then the final states
    written back to their pool slots; returns the exported states [E, ...]."""
    from fla.ops.utils.index import prepare_chunk_offsets

    exported = states_at_exports_fused(
        h, k, v, g_cum, cu, prepare_chunk_offsets(cu, FLA_CHUNK), export_token_ids, FLA_CHUNK,
        state_pool.dtype, v_first=v_first,
    )  # fmt: skip
    scatter_states(state_pool, state_indices, final)
    return exported
