"""Kimi Delta Attention over a varlen batch with pooled states (the oracles).

Per head, with state S [K, V], per-channel log decay g_t [K] (≤ 0) and scalar beta_t:

    S_t = (I - beta_t k_t k_tᵀ) diag(exp(g_t)) S_{t-1} + beta_t k_t v_tᵀ        o_t = S_tᵀ (scale · q_t)

`chunk_kda` evaluates it chunk-parallel (the UT / WY form, chunks restart at each span start);
`fused_recurrent_kda` token by token. Both read the initial state from `state_pool[state_indices[i]]`
(zeros where `has_initial_state[i]` is False), write the final state back to that slot, and return the
states right after the flat tokens `export_token_ids` as a side output of the same call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flashstate.ops.varlen import SpanFn, l2norm, run_varlen


def chunk_kda(
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
    """Chunk-parallel KDA (prefill form).

    q, k: [1, T, H, K]; v: [1, T, H, V]; g: [1, T, H, K] per-channel log decay; beta: [1, T, H];
    cu_seqlens: [N + 1]; state_pool: [S, H, K, V] fp32, updated in place at `state_indices` [N];
    has_initial_state: [N] bool; export_token_ids: [E] flat token indices.
    Returns o: [1, T, H, V] (q's dtype) and the exported states [E, H, K, V] (the pool's dtype).
    """
    del chunk_indices  # the metadata's FLA chunk list: the oracle needs none

    def span(q, k, v, g, beta, s0, rows):
        outs, exported = [], {}
        state = s0
        for c0 in range(0, q.shape[0], chunk_size):
            c1 = min(c0 + chunk_size, q.shape[0])
            want = [r - c0 for r in rows if c0 <= r < c1]
            o, state, states = _chunk(q[c0:c1], k[c0:c1], v[c0:c1], g[c0:c1], beta[c0:c1], state, want)
            outs.append(o)
            exported.update((c0 + r, s) for r, s in states.items())
        return torch.cat(outs), state, exported

    return _varlen(span, q, k, v, g, beta, scale, state_pool, state_indices, has_initial_state, cu_seqlens,
                   export_token_ids, use_qk_l2norm_in_kernel)


def fused_recurrent_kda(
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
    """Token-by-token KDA (decode form); same arguments, shapes and results as `chunk_kda`
    (`chunk_size` is accepted and ignored)."""

    def span(q, k, v, g, beta, s0, rows):
        want = set(rows)
        outs, exported = [], {}
        state = s0
        for t in range(q.shape[0]):
            state = state * g[t].exp()[:, :, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", k[t], state))
            state = state + k[t][:, :, None] * delta[:, None, :]
            outs.append(torch.einsum("hk,hkv->hv", q[t], state))
            if t in want:
                exported[t] = state
        return torch.stack(outs), state, exported

    return _varlen(span, q, k, v, g, beta, scale, state_pool, state_indices, has_initial_state, cu_seqlens,
                   export_token_ids, use_qk_l2norm_in_kernel)


def _chunk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor, rows: list[int]
) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
    """One chunk of c ≤ chunk_size tokens from state s0 [H, K, V].

    With G = cumsum(g) inside the chunk and D[r, s] = exp(G_r - G_s) for s ≤ r (0 above the diagonal):
        A    = strict_lower(beta_r · Σ_k k_r k_s D[r, s])           [H, c, c]
        U    = (I + A)⁻¹ (beta·v − (beta·k·exp(G)) S0)              the delta-rule "new values"
        o_r  = (q_r·exp(G_r)) S0 + Σ_{s≤r} (Σ_k q_r k_s D[r, s]) U_s
        S_r  = exp(G_r) ⊙ S0 + Σ_{s≤r} (k_s D[r, s]) U_sᵀ          state right after local token r
    (I + A) is unit lower-triangular, so rows ≤ r of U only see tokens ≤ r: S_r equals the final state of a
    run stopped after token r. Returns o [c, H, V], S_{c-1}, {r: S_r for r in rows}.
    """
    q, k, v, g = (x.transpose(0, 1) for x in (q, k, v, g))  # [H, c, D]
    beta = beta.transpose(0, 1)  # [H, c]
    c = q.shape[1]
    G = g.cumsum(1)
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    diff = G[:, :, None, :] - G[:, None, :, :]  # [H, r, s, K]
    decay = diff.masked_fill(~causal[:, :, None], float("-inf")).exp()
    A = ((k[:, :, None, :] * k[:, None, :, :] * decay).sum(-1) * beta[:, :, None]).tril(-1)
    eye = torch.eye(c, dtype=q.dtype, device=q.device).expand(A.shape)
    T = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    U = T @ (beta[..., None] * v) - (T @ (beta[..., None] * k * G.exp())) @ s0
    qk = (q[:, :, None, :] * k[:, None, :, :] * decay).sum(-1)  # [H, r, s], zero above the diagonal
    o = (q * G.exp()) @ s0 + qk @ U

    def state_at(r: int) -> Tensor:
        return G[:, r].exp()[:, :, None] * s0 + (k * decay[:, r]).transpose(1, 2) @ U

    return o.transpose(0, 1), state_at(c - 1), {r: state_at(r) for r in rows}


def _varlen(
    span: SpanFn,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    export_token_ids: Tensor | None,
    use_qk_l2norm: bool,
) -> tuple[Tensor, Tensor]:
    """fp32 inputs (q scaled, optionally l2-normalised) for `span` on each sequence."""
    if q.shape[0] != 1:
        raise ValueError(f"varlen inputs must have batch 1, got {q.shape[0]}")
    out_dtype = q.dtype
    q, k, v, g, beta = (x[0].float() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    o = torch.empty(*v.shape, dtype=torch.float32, device=v.device)
    exported = run_varlen(
        span, (q, k, v, g, beta), o, state_pool=state_pool, state_indices=state_indices,
        has_initial_state=has_initial_state, cu_seqlens=cu_seqlens, export_token_ids=export_token_ids,
    )
    return o.to(out_dtype).unsqueeze(0), exported
