"""Token-expert assignments sorted by expert and padded to the GEMM's row block, in torch ops that never
wait on the device: every output has a size fixed by (T, k, E, block), so a CUDA graph can capture it.

Assignment a = t·k + j is token t's j-th choice, ids.flatten()[a]. The sorted list holds each expert's
assignments (ascending a) in a run padded with the sentinel n = T·k to a multiple of `block`; runs are in
expert order, so block b of the list belongs to one expert, `block_expert[b]`, and blocks past the last
run say E (the kernels skip them). Length: an expert with c > 0 assignments takes c + (block − 1) rows
at most and at most min(E, n) experts have any, so n + min(E, n)·(block − 1) rows (rounded up to whole
blocks) always suffice."""

from __future__ import annotations

import torch
from torch import Tensor


def padded_length(n: int, num_experts: int, block: int) -> int:
    """Rows of the sorted list for n assignments over num_experts experts: a multiple of block."""
    rows = n + min(num_experts, n) * (block - 1)
    return (rows + block - 1) // block * block


def align_assignments(ids: Tensor, num_experts: int, block: int) -> tuple[Tensor, Tensor]:
    """ids [T, k] (int) → (sorted [P] int32: assignment indices, expert-major, each expert's run padded
    with n to a multiple of `block`; block_expert [P / block] int32: each block's expert, E past the end).
    """
    flat = ids.reshape(-1).long()
    n, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    run_end = padded.cumsum(0)
    run_start = run_end - padded
    first = counts.cumsum(0) - counts  # each expert's first position in the unpadded sorted order
    order = torch.sort(flat, stable=True).indices  # assignments by expert, ascending a within one
    expert_of = flat[order]
    dest = run_start[expert_of] + torch.arange(n, device=device) - first[expert_of]
    rows = padded_length(n, num_experts, block)
    sorted_ids = torch.full((rows,), n, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.int())
    starts = torch.arange(0, rows, block, device=device)
    block_expert = torch.searchsorted(run_end, starts, right=True, out_int32=True)
    return sorted_ids, block_expert
