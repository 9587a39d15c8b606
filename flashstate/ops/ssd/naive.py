"""Mamba2's selective SSM in its state-space-duality (SSD) form, varlen with pooled states (the oracle).

Per head h (group g = h // (H / G)), with Δ_t = clamp(softplus(dt_t + dt_bias), *dt_limit) and decay
a_t = Δ_t · A_h ≤ 0:

    S_t = exp(a_t) · S_{t-1} + Δ_t · x_t ⊗ B_t         S: [P, N]   (head_dim × d_state)
    y_t = S_t · C_t + D_h · x_t

The chunked form splits each sequence into chunks of `chunk_size` tokens (restarting at every sequence
start). Inside a chunk, with cumulative decay Λ_l = Σ_{j ≤ l} a_j:

    y_l    = Σ_{s ≤ l} (C_l · B_s) exp(Λ_l − Λ_s) Δ_s x_s   +   exp(Λ_l) · S_start C_l   +   D x_l
    S_end  = exp(Λ_last) · S_start + Σ_s exp(Λ_last − Λ_s) Δ_s x_s ⊗ B_s

The first term is a masked quadratic form (attention-like), the second reads the chunk's start state;
only S_start is passed from chunk to chunk. A state exported after chunk position l is the same sum
stopped at l, computed from the chunk's start state in the same call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.varlen import run_varlen


def _delta(dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float]) -> Tensor:
    """dt: [T, H] → Δ: [T, H] fp32."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def _prepare(x, dt, A, B, C, dt_bias, dt_softplus, dt_limit, real_tokens=None):
    """Flatten the batch dim, discretise Δ (0 where `real_tokens` is False), and give every head its group's
    B/C. All fp32."""
    if x.shape[0] != 1:
        raise ValueError(f"varlen inputs must have batch size 1, got {x.shape[0]}")
    heads, groups = x.shape[2], B.shape[2]
    if heads % groups:
        raise ValueError(f"{heads} heads cannot be split into {groups} groups")
    delta = _delta(dt[0], dt_bias, dt_softplus, dt_limit)  # [T, H]
    if real_tokens is not None:
        delta = torch.where(real_tokens[:, None], delta, 0.0)
    B = B[0].float().repeat_interleave(heads // groups, dim=1)  # [T, H, N]
    C = C[0].float().repeat_interleave(heads // groups, dim=1)
    return x[0].float(), delta, delta * A.float(), B, C


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
    """Chunk-parallel SSD over a varlen batch (the prefill form).

    x: [1, T, H, P]; dt: [1, T, H] (raw, before bias/softplus); A: [H] (negative); B, C: [1, T, G, N];
    D: [H] or None; dt_bias: [H]; state_pool: [S, H, P, N] fp32, slot `state_indices[i]` is read as the
    initial state of sequence i (zeros where `has_initial_state[i]` is False) and overwritten with its
    final state; cu_seqlens: [N + 1]. Returns y: [1, T, H, P] (x's dtype) and the states right after
    each flat token of `export_token_ids`: [E, H, P, N] fp32.
    """
    del chunk_indices  # the metadata's FLA chunk list: the oracle needs none
    xs, delta, a, B, C = _prepare(x, dt, A, B, C, dt_bias, dt_softplus, dt_limit, real_tokens)
    q = chunk_size
    tril = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()

    def span(xs, delta, a, B, C, state, rows):
        n = xs.shape[0]

        # Padded tokens carry Δ = 0: no decay, no input, so they change nothing.
        def chunks(t: Tensor) -> Tensor:
            t = F.pad(t, (0, 0) * (t.dim() - 1) + (0, -n % q))
            return t.reshape(-1, q, *t.shape[1:])

        xd = chunks(xs * delta[..., None])  # [c, Q, H, P]  Δ_s x_s
        Bc, Cc, lam = chunks(B), chunks(C), chunks(a).cumsum(dim=1)  # lam: [c, Q, H]
        seg = lam[:, :, None, :] - lam[:, None, :, :]  # [c, l, s, H]: Λ_l − Λ_s
        decay = torch.where(tril[None, :, :, None], seg, float("-inf")).exp()
        scores = torch.einsum("clhn,cshn->clsh", Cc, Bc) * decay
        y_intra = torch.einsum("clsh,cshp->clhp", scores, xd)
        to_end = (lam[:, -1:, :] - lam).exp()  # [c, Q, H]
        local = torch.einsum("clh,clhp,clhn->chpn", to_end, xd, Bc)  # chunk's own contribution
        starts = []
        for c in range(local.shape[0]):  # inter-chunk state passing
            starts.append(state)
            state = lam[c, -1, :, None, None].exp() * state + local[c]
        starts_t = torch.stack(starts)  # [c, H, P, N]
        y_inter = torch.einsum("clhn,chpn->clhp", Cc, starts_t) * lam.exp()[..., None]
        snaps = {}
        if rows:
            pos = torch.tensor(rows, device=xs.device)
            c, l = pos // q, pos % q
            inner = torch.einsum("esh,eshp,eshn->ehpn", decay[c, l], xd[c], Bc[c])
            snaps = dict(zip(rows, lam[c, l].exp()[:, :, None, None] * starts_t[c] + inner, strict=True))
        return (y_intra + y_inter).flatten(0, 1)[:n], state, snaps

    return _finish(span, x, xs, delta, a, B, C, D, state_pool, state_indices, has_initial_state, cu_seqlens,
                   export_token_ids)


def _finish(span, x, xs, delta, a, B, C, D, state_pool, state_indices, has_initial_state, cu_seqlens,
            export_token_ids) -> tuple[Tensor, Tensor]:
    y = torch.empty_like(xs)
    exported = run_varlen(
        span, (xs, delta, a, B, C), y, state_pool=state_pool, state_indices=state_indices,
        has_initial_state=has_initial_state, cu_seqlens=cu_seqlens, export_token_ids=export_token_ids,
    )
    if D is not None:
        y = y + D.float()[:, None] * xs
    return y.to(x.dtype)[None], exported


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
    """Token-by-token SSD (the decode form); same arguments, shapes and results as `chunk_ssd`."""
    xs, delta, a, B, C = _prepare(x, dt, A, B, C, dt_bias, dt_softplus, dt_limit)

    def span(xs, delta, a, B, C, state, rows):
        wanted, y, snaps = set(rows), torch.empty_like(xs), {}
        for t in range(xs.shape[0]):
            # S = exp(Δ A) S + (Δ x) ⊗ B;  y = S C
            dx = delta[t, :, None] * xs[t]  # [H, P]
            state = a[t, :, None, None].exp() * state + dx[..., None] * B[t, :, None, :]
            y[t] = torch.einsum("hpn,hn->hp", state, C[t])
            if t in wanted:
                snaps[t] = state
        return y, state, snaps

    return _finish(span, x, xs, delta, a, B, C, D, state_pool, state_indices, has_initial_state, cu_seqlens,
                   export_token_ids)
