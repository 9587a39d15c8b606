"""The DeepSeek-style MoE router of Nemotron-H and Kimi-Linear (HF names: `gate.weight`,
`gate.e_score_correction_bias`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashstate.ops.moe import grouped_topk
from flashstate.spec.model_spec import MoeSpec


class GroupedTopkRouter(nn.Module):
    """Sigmoid scores; experts chosen by score + correction bias inside the best `topk_group` of `n_group`
    groups (a group ranked by the sum of its two best biased scores); weights are the unbiased scores,
    renormalised if `norm_topk_prob`, times `routed_scaling_factor`. All fp32."""

    def __init__(self, hidden: int, moe: MoeSpec):
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(moe.num_experts))

    def _apply(self, fn, recurse=True):
        # The correction bias stays fp32 whatever dtype the model is cast to (HF keeps it fp32 too): a
        # rounded bias can change which experts are picked.
        bias = self._buffers.pop("e_score_correction_bias")
        super()._apply(fn, recurse)
        moved = fn(bias)
        if moved.dtype != bias.dtype:
            moved = bias.to(moved.device)
        self._buffers["e_score_correction_bias"] = moved
        return self

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: [T, D] → (weights [T, k] fp32, expert ids [T, k]); no device wait (CUDA-graph safe)."""
        m = self.moe
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        return grouped_topk(
            scores,
            self.e_score_correction_bias,
            m.top_k,
            m.n_group,
            m.topk_group,
            m.norm_topk_prob,
            m.routed_scaling_factor,
        )
