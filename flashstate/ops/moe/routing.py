"""MoE routers' expert choice, in torch ops that never wait on the device (topk, gather, scatter): the
same code serves the CPU oracle and CUDA-graph captures.

Both return (weights [T, k] fp32, expert ids [T, k] int64); a token's k ids are distinct."""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_topk(logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """Qwen-style: fp32 softmax over all experts, the k most probable; with `renormalize` their
    probabilities divided by their sum (norm_topk_prob)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def grouped_topk(
    scores: Tensor,
    correction_bias: Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float,
) -> tuple[Tensor, Tensor]:
    """DeepSeek-style over sigmoid `scores` [T, E] (fp32): experts chosen by score + correction bias
    inside the best `topk_group` of `n_group` equal groups (a group ranked by the sum of its two best
    biased scores); weights are the unbiased scores, renormalised over the k if `renormalize`, times
    `scaling`."""
    choice = scores + correction_bias.float()
    grouped = choice.unflatten(-1, (n_group, -1))  # [T, n_group, experts per group]
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)  # [T, n_group]
    best_groups = group_scores.topk(topk_group, dim=-1).indices
    keep = torch.zeros(grouped.shape[:2], dtype=torch.bool, device=scores.device)
    keep.scatter_(1, best_groups, True)
    choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, ids
