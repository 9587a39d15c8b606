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


def _delta(dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float]) -> Tensor:
    """dt: [T, H] → Δ: [T, H] fp32."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def _prepare(x, dt, A, B, C, dt_bias, dt_softplus, dt_limit):
    """Flatten the batch dim, discretise Δ, and give every head its group's B/C. All fp32."""
    if x.shape[0] != 1:
        raise ValueError(f"varlen inputs must have batch size 1, got {x.shape[0]}")
    heads, groups = x.shape[2], B.shape[2]
    if heads % groups:
        raise ValueError(f"{heads} heads cannot be split into {groups} groups")
    delta = _delta(dt[0], dt_bias, dt_softplus, dt_limit)  # [T, H]
    B = B[0].float().repeat_interleave(heads // groups, dim=1)  # [T, H, N]
    C = C[0].float().repeat_interleave(heads // groups, dim=1)
    return x[0].float(), delta, delta * A.float(), B, C


def _initial(state_pool: Tensor, slot: int, has_initial: bool) -> Tensor:
    if has_initial:
        return state_pool[slot].float()
    return state_pool.new_zeros(state_pool.shape[1:], dtype=torch.float32)


def _exports_by_seq(export_token_ids: Tensor | None, bounds: list[int]) -> list[list[tuple[int, int]]]:
    """For each sequence: (export index, position inside the span) pairs."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(len(bounds) - 1)]
    for e, t in enumerate([] if export_token_ids is None else export_token_ids.tolist()):
        i = next((i for i in range(len(bounds) - 1) if bounds[i] <= t < bounds[i + 1]), None)
        if i is None:
            raise ValueError(f"export token {t} lies outside the batch of {bounds[-1]} tokens")
        out[i].append((e, t - bounds[i]))
    return out


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
    xs, delta, a, B, C = _prepare(x, dt, A, B, C, dt_bias, dt_softplus, dt_limit)
    bounds = cu_seqlens.tolist()
    exports = _exports_by_seq(export_token_ids, bounds)
    y = torch.empty_like(xs)
    exported = state_pool.new_empty((sum(map(len, exports)), *state_pool.shape[1:]), dtype=torch.float32)
    q = chunk_size
    tril = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    for i in range(len(bounds) - 1):
        start, end = bounds[i], bounds[i + 1]
        n = end - start
        pad = -n % q
        # Padded tokens carry Δ = 0: no decay, no input, so they change nothing.
        def chunks(t: Tensor, start=start, end=end, pad=pad) -> Tensor:
            t = F.pad(t[start:end], (0, 0) * (t.dim() - 1) + (0, pad))
            return t.reshape(-1, q, *t.shape[1:])

        xd = chunks(xs * delta[..., None])  # [c, Q, H, P]  Δ_s x_s
        Bc, Cc, lam = chunks(B), chunks(C), chunks(a).cumsum(dim=1)  # lam: [c, Q, H]
        seg = lam[:, :, None, :] - lam[:, None, :, :]  # [c, l, s, H]: Λ_l − Λ_s
        decay = torch.where(tril[None, :, :, None], seg, float("-inf")).exp()
        scores = torch.einsum("clhn,cshn->clsh", Cc, Bc) * decay
        y_intra = torch.einsum("clsh,cshp->clhp", scores, xd)
        to_end = (lam[:, -1:, :] - lam).exp()  # [c, Q, H]
        local = torch.einsum("clh,clhp,clhn->chpn", to_end, xd, Bc)  # chunk's own contribution
        state = _initial(state_pool, int(state_indices[i]), bool(has_initial_state[i]))
        starts = []
        for c in range(local.shape[0]):  # inter-chunk state passing
            starts.append(state)
            state = lam[c, -1, :, None, None].exp() * state + local[c]
        starts_t = torch.stack(starts)  # [c, H, P, N]
        y_inter = torch.einsum("clhn,chpn->clhp", Cc, starts_t) * lam.exp()[..., None]
        y[start:end] = (y_intra + y_inter).flatten(0, 1)[:n]
        state_pool[int(state_indices[i])] = state.to(state_pool.dtype)
        if exports[i]:
            idx = torch.tensor([e for e, _ in exports[i]], device=x.device)
            pos = torch.tensor([p for _, p in exports[i]], device=x.device)
            c, l = pos // q, pos % q
            inner = torch.einsum("esh,eshp,eshn->ehpn", decay[c, l], xd[c], Bc[c])
            exported[idx] = lam[c, l].exp()[:, :, None, None] * starts_t[c] + inner
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
    bounds = cu_seqlens.tolist()
    exports = _exports_by_seq(export_token_ids, bounds)
    y = torch.empty_like(xs)
    exported = state_pool.new_empty((sum(map(len, exports)), *state_pool.shape[1:]), dtype=torch.float32)
    for i in range(len(bounds) - 1):
        start, end = bounds[i], bounds[i + 1]
        wanted = {p: e for e, p in exports[i]}
        state = _initial(state_pool, int(state_indices[i]), bool(has_initial_state[i]))
        for t in range(start, end):
            # S = exp(Δ A) S + (Δ x) ⊗ B;  y = S C
            dx = delta[t, :, None] * xs[t]  # [H, P]
            state = a[t, :, None, None].exp() * state + dx[..., None] * B[t, :, None, :]
            y[t] = torch.einsum("hpn,hn->hp", state, C[t])
            if t - start in wanted:
                exported[wanted[t - start]] = state
        state_pool[int(state_indices[i])] = state.to(state_pool.dtype)
    if D is not None:
        y = y + D.float()[:, None] * xs
    return y.to(x.dtype)[None], exported
