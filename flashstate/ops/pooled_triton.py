"""Triton pieces shared by the GPU backends: clearing the pool slots of fresh sequences, and the in-place
one-token decode of the delta rules (FLA's KDA recurrent kernel indexing the pool by slot)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashstate.ops.pooled import decode_exports

# Sequences the export kernel scans per loop step. A fixed block (with N not specialised) keeps one compiled
# variant for every batch: a block sized to each batch's N compiled a new variant while serving whenever a
# step met a batch size the warm-up had not (seconds per variant on a bare machine).
EXPORT_SEQ_BLOCK = 64


@triton.jit
def _zero_fresh_kernel(pool, indices, has_initial, slot_stride, slot_numel, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    if tl.load(has_initial + i) == 0:
        slot = tl.load(indices + i).to(tl.int64)
        offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(
            pool + slot * slot_numel + offs, tl.zeros([BLOCK], pool.dtype.element_ty), mask=offs < slot_numel
        )


def zero_fresh_slots(state_pool: Tensor, state_indices: Tensor, has_initial_state: Tensor) -> None:
    """Zero the pool slot of every sequence without an initial state (in place, no host sync)."""
    n = state_indices.shape[0]
    if n == 0:
        return
    if not state_pool[0].is_contiguous():
        raise ValueError("each pool slot must be contiguous")
    slot_numel = state_pool[0].numel()
    block = 4096
    _zero_fresh_kernel[(n, triton.cdiv(slot_numel, block))](
        state_pool,
        state_indices.to(state_pool.device),
        has_initial_state.to(state_pool.device),
        state_pool.stride(0),
        slot_numel,
        BLOCK=block,
    )


def decode_delta_rule_in_place(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gk: Tensor,
    beta: Tensor,
    *,
    scale: float | None,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    export_token_ids: Tensor | None,
    use_qk_l2norm_in_kernel: bool,
) -> tuple[Tensor, Tensor]:
    """One token per sequence (q: [1, N, H, K]; gk: [1, N, HV, K] per-channel log decay; the callers send
    only batches with N == T here, and spans are never empty, so N == T means one token each); the state
    of sequence i is read from and written back to pool slot `state_indices[i]`. The export of token i is
    its sequence's new state."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    if state_pool.dtype != torch.float32:
        raise ValueError(f"the in-place decode keeps fp32 states, got a {state_pool.dtype} pool")
    zero_fresh_slots(state_pool, state_indices, has_initial_state)
    n = q.shape[1]
    as_batch = [x.reshape(n, 1, *x.shape[2:]).contiguous() for x in (q, k, v, gk, beta)]
    o, _ = fused_recurrent_kda_fwd(
        *as_batch,
        initial_state=state_pool,
        scale=scale,
        inplace_final_state=True,
        ssm_state_indices=state_indices.to(torch.int64),
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    return o.reshape(v.shape), decode_exports(state_pool, state_indices, export_token_ids)


@triton.jit(do_not_specialize=["N"])
def _export_kernel(
    h,
    k,
    v_new,
    g_cum,
    cu_seqlens,
    chunk_offsets,
    export_ids,
    out,
    N,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    V_FIRST: tl.constexpr,
):
    e = tl.program_id(0)
    hv = tl.program_id(1)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    kk = tl.arange(0, BK)
    k_ok, v_ok = kk < K, vv < V
    t = tl.load(export_ids + e).to(tl.int64)
    seq = 0  # sequences that end at or before t, counted BLOCK_N at a time (one variant for any N)
    for first_seq in range(0, N, BLOCK_N):
        seqs = first_seq + tl.arange(0, BLOCK_N)
        ends = tl.load(cu_seqlens + 1 + seqs, mask=seqs < N, other=0).to(tl.int64)
        seq += tl.sum(((ends <= t) & (seqs < N)).to(tl.int32))
    bos = tl.load(cu_seqlens + seq).to(tl.int64)
    local_chunk = (t - bos) // C
    first = bos + local_chunk * C
    chunk = tl.load(chunk_offsets + seq).to(tl.int64) + local_chunk

    s = tl.arange(0, C)
    tok = first + s
    rows_ok = tok <= t
    tok = tl.minimum(tok, t)
    if PER_CHANNEL:
        g_t = tl.load(g_cum + (t * HV + hv) * K + kk, mask=k_ok, other=0.0)  # [BK]
        g_s = tl.load(g_cum + (tok[:, None] * HV + hv) * K + kk[None, :], mask=k_ok[None, :], other=0.0)
        weight = tl.where(rows_ok[:, None], tl.exp2(g_t[None, :] - g_s), 0.0)  # [C, BK]
        decay = tl.exp2(g_t)[:, None]  # [BK, 1]
    else:
        g_t = tl.load(g_cum + t * HV + hv)
        g_s = tl.load(g_cum + tok * HV + hv)
        weight = tl.where(rows_ok, tl.exp2(g_t - g_s), 0.0)[:, None]
        decay = tl.exp2(g_t)
    head = hv // (HV // H)
    keys = tl.load(k + (tok[:, None] * H + head) * K + kk[None, :], mask=k_ok[None, :], other=0.0).to(
        tl.float32
    )
    vals = tl.load(v_new + (tok[:, None] * HV + hv) * V + vv[None, :], mask=v_ok[None, :], other=0.0)
    local = tl.dot(tl.trans(keys * weight), vals.to(tl.float32), input_precision="ieee")  # [BK, BV]
    mask = k_ok[:, None] & v_ok[None, :]
    if V_FIRST:
        offs = vv[None, :] * K + kk[:, None]
    else:
        offs = kk[:, None] * V + vv[None, :]
    start = tl.load(h + (chunk * HV + hv) * K * V + offs, mask=mask, other=0.0).to(tl.float32)
    state = decay * start + local
    tl.store(out + (e * HV + hv) * K * V + offs, state.to(out.dtype.element_ty), mask=mask)


def states_at_exports_fused(
    h: Tensor,
    k: Tensor,
    v_new: Tensor,
    g_cum: Tensor,
    cu_seqlens: Tensor,
    chunk_offsets: Tensor,
    export_token_ids: Tensor | None,
    chunk_size: int,
    out_dtype: torch.dtype,
    *,
    v_first: bool = False,
) -> Tensor:
    """`pooled.states_at_exports` in one launch: one program per (export, value head, value block).
    chunk_offsets: [N + 1] index of each sequence's first chunk. Inputs contiguous."""
    if export_token_ids is None:
        export_token_ids = cu_seqlens.new_empty(0)
    export_token_ids = export_token_ids.to(device=k.device)
    e, heads, kdim, vdim = export_token_ids.shape[0], v_new.shape[2], k.shape[-1], v_new.shape[-1]
    shape = (e, heads, vdim, kdim) if v_first else (e, heads, kdim, vdim)
    out = torch.empty(shape, dtype=out_dtype, device=k.device)
    if e == 0:
        return out
    n = cu_seqlens.shape[0] - 1
    bv = min(triton.next_power_of_2(vdim), 32)
    _export_kernel[(e, heads, triton.cdiv(vdim, bv))](
        h,
        k,
        v_new,
        g_cum,
        cu_seqlens,
        chunk_offsets,
        export_token_ids,
        out,
        n,
        H=k.shape[2],
        HV=heads,
        K=kdim,
        V=vdim,
        C=chunk_size,
        BK=triton.next_power_of_2(kdim),
        BV=bv,
        BLOCK_N=EXPORT_SEQ_BLOCK,
        PER_CHANNEL=g_cum.dim() == 4,
        V_FIRST=v_first,
    )
    return out
