"""The varlen driver shared by the recurrent reference ops: one span per sequence, its initial state read
from the pool by index (zeros without one), its final state written back, exported states collected."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

# (*inputs sliced to the span [L, ...] fp32, initial state fp32, local export rows)
#   → (output [L, ...], final state, {local row: state right after that row})
SpanFn = Callable[..., tuple[Tensor, Tensor, dict[int, Tensor]]]

def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(Σx² + eps) over the last dim (FLA's form: eps inside the root, not a clamp)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def exports_by_sequence(export_token_ids: Tensor | None, bounds: list[int]) -> list[list[tuple[int, int]]]:
    """For each sequence: (export index, row inside its span) pairs."""
    per_seq: list[list[tuple[int, int]]] = [[] for _ in range(len(bounds) - 1)]
    for e, t in enumerate([] if export_token_ids is None else export_token_ids.tolist()):
        i = bisect.bisect_right(bounds, t) - 1
        if not (0 <= i < len(per_seq) and bounds[i] <= t < bounds[i + 1]):
            raise ValueError(f"export token {t} lies outside the batch's {bounds[-1]} tokens")
        per_seq[i].append((e, t - bounds[i]))
    return per_seq


def run_varlen(
    span: SpanFn,
    inputs: Sequence[Tensor],
    out: Tensor,
    *,
    state_pool: Tensor,
    state_indices: Tensor,
    has_initial_state: Tensor,
    cu_seqlens: Tensor,
    export_token_ids: Tensor | None,
) -> Tensor:
    """inputs: flat [T, ...] fp32 tensors; `out` [T, ...] receives each span's output. The pool slot of
    each sequence is overwritten with its final state. Returns the exported states [E, *state]."""
    bounds = cu_seqlens.tolist()
    per_seq = exports_by_sequence(export_token_ids, bounds)
    exported = state_pool.new_empty((sum(map(len, per_seq)), *state_pool.shape[1:]))
    for i in range(len(bounds) - 1):
        start, end = bounds[i], bounds[i + 1]
        slot = int(state_indices[i])
        if bool(has_initial_state[i]):
            s0 = state_pool[slot].float()
        else:
            s0 = torch.zeros(state_pool.shape[1:], dtype=torch.float32, device=state_pool.device)
        if start == end:
            state_pool[slot] = s0.to(state_pool.dtype)
            continue
        rows = [r for _, r in per_seq[i]]
        o, final, states = span(*(x[start:end] for x in inputs), s0, rows)
        out[start:end] = o
        for e, r in per_seq[i]:
            exported[e] = states[r].to(exported.dtype)
        state_pool[slot] = final.to(state_pool.dtype)
    return exported
