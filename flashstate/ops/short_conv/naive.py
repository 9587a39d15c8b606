"""Short causal depthwise conv over a varlen batch with pooled conv states (the oracle)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    *,
    conv_state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    token_seqs: Tensor | None = None,
    span_ends: Tensor | None = None,
    export_token_ids: Tensor | None = None,
    activation: str | None = "silu",
    out_splits: list[int] | None = None,
) -> tuple[Tensor | tuple[Tensor, ...], Tensor]:
    """y[t] = act(bias + Σ_j weight[:, j] · x[t - K + 1 + j]), reaching into the pooled state before t = 0.

    x: [T, D]; weight: [D, K]; conv_state_pool: [S, D, K - 1] holds each slot's last K - 1 inputs
    (oldest first). Returns y: [T, D] and the exported conv states [E, D, K - 1]. Pool slots
    `state_indices` are overwritten with the last K - 1 inputs of each span (up to and including flat token
    span_ends[i] when given: a span padded past its real end). With `out_splits` (1 to 3
    channel counts summing to D), y comes back as one contiguous [T, s] tensor per part.
    """
    del token_seqs  # the metadata's sequence of each token: the oracle walks the spans itself
    if out_splits is not None and (sum(out_splits) != x.shape[1] or not 1 <= len(out_splits) <= 3):
        raise ValueError(f"out_splits {out_splits} must be 1 to 3 parts summing to {x.shape[1]}")
    width = weight.shape[1] - 1
    ys, exported = [], {}
    export = [] if export_token_ids is None else export_token_ids.tolist()
    bounds = cu_seqlens.tolist()
    ends = bounds[1:] if span_ends is None else [e + 1 for e in span_ends.tolist()]
    for i in range(len(bounds) - 1):
        start, end = bounds[i], bounds[i + 1]
        slot = int(state_indices[i])
        prev = (
            conv_state_pool[slot]
            if bool(has_initial_state[i])
            else conv_state_pool.new_zeros(conv_state_pool.shape[1:])
        )
        seq = torch.cat([prev.to(x.dtype), x[start:end].T], dim=1)  # [D, K - 1 + L]
        y = F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), bias, groups=seq.shape[0])[0]  # [D, L]
        ys.append(y.T)
        for e, t in enumerate(export):
            if start <= t < end:
                n = t - start + 1
                exported[e] = seq[:, n : n + width]
        n = ends[i] - start
        conv_state_pool[slot] = seq[:, n : n + width].to(conv_state_pool.dtype)
    y = torch.cat(ys, dim=0)
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"unsupported activation {activation!r}")
    out = conv_state_pool.new_empty((len(export), *conv_state_pool.shape[1:]))
    for e in range(len(export)):
        out[e] = exported[e]
    if out_splits is not None:
        return tuple(p.contiguous() for p in y.split(out_splits, dim=-1)), out
    return y, out
