"""Gated delta rule over a varlen batch with pooled recurrent states (the oracle).

Per value head, with the state S: [K, V] (read as S^T k) and a token (q, k, v, g, β):

    S ← exp(g) · S
    δ = β · (v − S^T k)                  the delta rule: write only what S does not already predict
    S ← S + k δ^T
    o = S^T q                            (q scaled by `scale`, default K^-0.5)

`chunk_gated_delta_rule` evaluates this chunk-parallel. Inside a chunk of C tokens, with S0 the state
before it and G_t = g_1 + … + g_t (log decay from the chunk start):

    S_t = exp(G_t) S0 + Σ_{i≤t} exp(G_t − G_i) k_i δ_i^T
    (I + A) δ = β v − β exp(G) k S0,     A_ti = β_t exp(G_t − G_i) k_t·k_i  for i < t
    δ = u − w S0,                        u = (I + A)^-1 (β v),  w = (I + A)^-1 (β exp(G) k)

(the UT transform: A is strictly lower triangular, so δ_{≤t} only depends on tokens ≤ t). u, w and the
intra-chunk attention are computed for all chunks at once; only S0 → S_C is sequential. A state exported
after token t of a chunk is S_t above, taken from the same δ.

`fused_recurrent_gated_delta_rule` steps token by token (the decode form). Both take the same arguments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.varlen import l2norm, run_varlen


def _recurrent_span(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, offsets: list[int],
    chunk_size: int,
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """One sequence token by token. q, k: [L, H, K]; v: [L, H, V]; g, beta: [L, H]; state: [H, K, V].
    Returns o: [L, H, V], the final state, and the states after each token offset in `offsets`."""
    del chunk_size
    out = v.new_empty(v.shape)
    snaps = {}
    wanted = set(offsets)
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hk,hkv->hv", k[t], state)) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t], state)
        if t in wanted:
            snaps[t] = state
    return out, state, [snaps[t] for t in offsets]


def _chunk_span(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, offsets: list[int],
    chunk_size: int,
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """One sequence chunk-parallel; same contract as `_recurrent_span`."""
    length, c = q.shape[0], chunk_size
    pad = (-length) % c
    n = (length + pad) // c

    # [L, H, D] → [H, n, C, D]; padded tokens have k = v = β = 0 and g = 0, so they change nothing.
    def chunks(x: Tensor) -> Tensor:
        x = x.movedim(0, 1)
        x = F.pad(x, (0, 0, 0, pad)) if x.dim() == 3 else F.pad(x, (0, pad))
        return x.reshape(x.shape[0], n, c, *x.shape[2:])

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    G = g.cumsum(-1)  # [H, n, C]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    # decay[..., t, i] = exp(G_t − G_i) for i ≤ t, else 0
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kb, vb = k * beta[..., None], v * beta[..., None]
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    system = eye + ((kb @ k.transpose(-1, -2)) * decay).tril(-1)  # I + A
    u = torch.linalg.solve_triangular(system, vb, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * G.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # [H, n, C, C], diagonal included
    q_read = q * G.exp()[..., None]  # reads exp(G_t) S0
    k_write = k * (G[..., -1:] - G).exp()[..., None]  # writes decayed to the chunk end
    chunk_decay = G[..., -1].exp()[..., None, None]  # [H, n, 1, 1]

    by_chunk: dict[int, list[int]] = {}
    for e, t in enumerate(offsets):
        by_chunk.setdefault(t // c, []).append(e)
    snaps: list[Tensor | None] = [None] * len(offsets)
    out = v.new_empty(v.shape)
    for i in range(n):
        delta = u[:, i] - w[:, i] @ state  # [H, C, V]
        out[:, i] = q_read[:, i] @ state + attn[:, i] @ delta
        if i in by_chunk:
            es = by_chunk[i]
            js = torch.tensor([offsets[e] % c for e in es], device=q.device)
            Gj = G[:, i, js]  # [H, E]
            # weight[h, e, s] = exp(G_j − G_s) for s ≤ j
            weight = (Gj[:, :, None] - G[:, i, None, :]).masked_fill(
                torch.arange(c, device=q.device)[None, :] > js[:, None], float("-inf")
            ).exp()
            at = Gj.exp()[..., None, None] * state[:, None] + torch.einsum(
                "hes,hsk,hsv->hekv", weight, k[:, i], delta
            )
            for col, e in enumerate(es):
                snaps[e] = at[:, col]
        state = state * chunk_decay[:, i] + k_write[:, i].transpose(-1, -2) @ delta
    out = out.reshape(out.shape[0], n * c, -1)[:, :length].movedim(1, 0)
    return out, state, snaps


def _run(span_fn, q, k, v, g, beta, scale, state_pool, state_indices, has_initial_state, cu_seqlens,
         export_token_ids, use_qk_l2norm_in_kernel, chunk_size) -> tuple[Tensor, Tensor]:
    if q.shape[0] != 1:
        raise ValueError(f"varlen ops take a flat batch [1, T, ...], got batch {q.shape[0]}")
    out_dtype = v.dtype
    q, k, v, g, beta = (x[0].float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    groups = v.shape[1] // k.shape[1]
    if groups > 1:  # each q/k head serves `groups` consecutive value heads
        q, k = q.repeat_interleave(groups, dim=1), k.repeat_interleave(groups, dim=1)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)

    def span(q, k, v, g, beta, s0, rows):
        o, final, snaps = span_fn(q, k, v, g, beta, s0, rows, chunk_size)
        return o, final, dict(zip(rows, snaps, strict=True))

    out = torch.empty_like(v)
    exported = run_varlen(
        span, (q, k, v, g, beta), out, state_pool=state_pool, state_indices=state_indices,
        has_initial_state=has_initial_state, cu_seqlens=cu_seqlens, export_token_ids=export_token_ids,
    )
    return out.to(out_dtype)[None], exported


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
    """Chunk-parallel gated delta rule (the prefill form).

    q, k: [1, T, Hk, K]; v: [1, T, HV, V] with HV a multiple of Hk (q/k head h serves value heads
    [h·HV/Hk, (h+1)·HV/Hk)); g (log decay, ≤ 0), beta: [1, T, HV]; cu_seqlens: [N + 1];
    state_pool: [S, HV, K, V] fp32 — sequence i starts from slot state_indices[i] (zeros where
    has_initial_state[i] is False) and its final state is written back there; export_token_ids: [E]
    flat token indices. Chunks of `chunk_size` restart at each sequence start.
    Returns o: [1, T, HV, V] (v's dtype) and the states right after each export token [E, HV, K, V].
    """
    del chunk_indices  # the metadata's FLA chunk list: the oracle needs none
    return _run(_chunk_span, q, k, v, g, beta, scale, state_pool, state_indices, has_initial_state,
                cu_seqlens, export_token_ids, use_qk_l2norm_in_kernel, chunk_size)


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
    """Token-by-token gated delta rule (the decode form); same arguments and results as
    `chunk_gated_delta_rule` (`chunk_size` is ignored)."""
    return _run(_recurrent_span, q, k, v, g, beta, scale, state_pool, state_indices, has_initial_state,
                cu_seqlens, export_token_ids, use_qk_l2norm_in_kernel, chunk_size)


def decode_gated_delta_rule_in_place(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,  # noqa: N803
    dt_bias: Tensor,
    *,
    scale: float | None = None,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    export_token_ids: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor]:
    """One token per sequence with the gates' inputs a, b [N, HV]: the gates, then the recurrent step (the
    oracle of the fused GPU decode kernel)."""
    from flashstate.ops.gdn_gating.naive import gdn_gating

    g, beta = gdn_gating(a, b, A_log, dt_bias)
    cu = torch.arange(q.shape[1] + 1, device=q.device)
    return fused_recurrent_gated_delta_rule(
        q, k, v, g[None], beta[None], scale=scale, state_pool=state_pool, state_indices=state_indices,
        has_initial_state=has_initial_state, cu_seqlens=cu, export_token_ids=export_token_ids,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )  # fmt: skip
