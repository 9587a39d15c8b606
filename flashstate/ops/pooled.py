"""Pool I/O shared by the GPU backends: gather initial states by slot, scatter final states back, and the
chunk windows an in-chunk export is computed from. All sync-free (no host reads of device tensors)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def gather_states(state_pool: Tensor, state_indices: Tensor, has_initial_state: Tensor) -> Tensor:
    """[N, *state] fp32: slot `state_indices[i]` of the pool, zeros where `has_initial_state[i]` is False."""
    states = state_pool.index_select(0, state_indices.to(device=state_pool.device, dtype=torch.long)).float()
    keep = has_initial_state.to(device=states.device, dtype=torch.bool)
    return torch.where(keep.view(-1, *([1] * (states.dim() - 1))), states, 0.0)


def scatter_states(state_pool: Tensor, state_indices: Tensor, states: Tensor) -> None:
    """Write [N, *state] back to the pool slots `state_indices` (in place)."""
    state_pool.index_copy_(
        0, state_indices.to(device=state_pool.device, dtype=torch.long), states.to(state_pool.dtype)
    )


def decode_exports(state_pool: Tensor, state_indices: Tensor, export_token_ids: Tensor | None) -> Tensor:
    """After a one-token-per-sequence step that updated the pool in place: token e's export is its
    sequence's new state, slot state_indices[e]. [E, *state]; empty without exports."""
    if export_token_ids is None or export_token_ids.numel() == 0:
        return state_pool.new_empty((0, *state_pool.shape[1:]))
    return state_pool.index_select(0, state_indices.long()[export_token_ids.long()])


def chunk_offsets(cu_seqlens: Tensor, chunk_size: int) -> Tensor:
    """[N + 1]: index of each sequence's first chunk in the flat chunk list (chunks restart per sequence)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return F.pad(((lengths + chunk_size - 1) // chunk_size).cumsum(0), (1, 0))


def export_windows(
    cu_seqlens: Tensor, export_token_ids: Tensor, chunk_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Where each export token sits in the chunked pass.

    Returns chunk [E] (flat chunk index, as FLA numbers chunks of a varlen batch), tokens [E, C] (the flat
    token ids of that chunk, clamped to the batch) and upto [E, C] (True for the chunk's tokens ≤ the
    export token): the exported state is the chunk's start state advanced over the `upto` tokens.
    """
    t = export_token_ids.to(device=cu_seqlens.device, dtype=torch.long)
    cu = cu_seqlens.long()
    seq = torch.searchsorted(cu, t, right=True) - 1
    local = t - cu[seq]
    first = cu[seq] + local // chunk_size * chunk_size
    chunk = chunk_offsets(cu, chunk_size)[seq] + local // chunk_size
    step = torch.arange(chunk_size, device=cu.device)
    tokens = first[:, None] + step
    upto = tokens <= t[:, None]
    return chunk, torch.minimum(tokens, t[:, None]), upto


def states_at_exports(
    h: Tensor,
    k: Tensor,
    v_new: Tensor,
    g_cum: Tensor,
    cu_seqlens: Tensor,
    export_token_ids: Tensor,
    chunk_size: int,
    *,
    v_first: bool = False,
) -> Tensor:
    """Exported states from one chunked pass: each export's chunk start state advanced to its token.

    h: [1, NC, HV, K, V] (or [.., V, K] with `v_first`), the state at the start of every chunk;
    k: [1, T, H, K] (H divides HV); v_new: [1, T, HV, V], the values the pass wrote into the state
    (u − w S0 for the delta rules, Δ·x for SSD); g_cum: [1, T, HV] or [1, T, HV, K], log2 decay summed from
    the chunk start. With G the chunk-local cumulative decay, the state right after token t is

        S_t = exp2(G_t) ⊙ S_start + Σ_{chunk start ≤ s ≤ t} (k_s ⊙ exp2(G_t − G_s)) v_new_sᵀ

    Returns [E, HV, K, V] (or [E, HV, V, K]) fp32.
    """
    chunk, tokens, upto = export_windows(cu_seqlens, export_token_ids, chunk_size)
    t = export_token_ids.to(device=k.device, dtype=torch.long)
    heads = v_new.shape[2]
    keys = k[0, tokens].float()  # [E, C, H, K]
    if keys.shape[2] != heads:
        keys = keys.repeat_interleave(heads // keys.shape[2], dim=2)
    g_t, g_s = g_cum[0, t].float(), g_cum[0, tokens].float()  # [E, HV(, K)], [E, C, HV(, K)]
    upto = upto.view(*upto.shape, *([1] * (g_s.dim() - 2)))
    weight = torch.where(upto, torch.exp2(g_t[:, None] - g_s), 0.0)
    keys = keys * (weight if weight.dim() == 4 else weight[..., None])
    local = torch.einsum(
        "echv,echk->ehvk" if v_first else "echk,echv->ehkv",
        *((v_new[0, tokens].float(), keys) if v_first else (keys, v_new[0, tokens].float())),
    )
    decay = torch.exp2(g_t)
    if decay.dim() == 2:
        decay = decay[..., None, None]
    else:
        decay = decay[..., None, :] if v_first else decay[..., None]
    return decay * h[0, chunk].float() + local
