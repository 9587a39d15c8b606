"""An MoE block's expert weights kept as two stacked tensors that the fused kernels read, with every
expert's checkpoint parameters (HF names, shapes, state_dict unchanged) views of their rows.

After every device or dtype move (`_apply`): w_in[e] = [in_names' weights of expert e, rows side by
side], w_out[e] = its `out_name` weight. In-place loads (`param.copy_`) keep the views; a replaced
Parameter is noticed on the first expert and the stacks are made again."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flashstate.layers.stacked_linear import StackedLinears
from flashstate.ops.moe import Experts


def _stack(experts: nn.ModuleList, names: tuple[str, ...]) -> Tensor:
    """[E, Σ rows, in] copied from each expert's `names` weights, each weight made a view of its rows."""
    first = [getattr(experts[0], n).weight for n in names]
    rows = sum(w.shape[0] for w in first)
    stacked = torch.empty(len(experts), rows, first[0].shape[1], dtype=first[0].dtype, device=first[0].device)
    for e, ex in enumerate(experts):
        start = 0
        for n in names:
            linear = getattr(ex, n)
            w = linear.weight
            view = stacked[e, start : start + w.shape[0]]
            with torch.no_grad():
                view.copy_(w)
            linear.weight = nn.Parameter(view, requires_grad=w.requires_grad)
            start += w.shape[0]
        if isinstance(ex, StackedLinears) and ex.stacked_names == names:
            ex._stacked = stacked[e]  # the expert's own stacked GEMM weight is the same rows
    return stacked


class StackedExperts(nn.Module):
    """Mixin for an MoE block with an `experts` ModuleList; set `expert_in_names`, `expert_out_name`,
    `expert_act` and `expert_gated` (silu(gate) · up over in_names = (gate, up)) before the first move;
    `accumulate` is the dtype the oracle sums expert outputs in (None: the input's)."""

    experts: nn.ModuleList
    expert_in_names: tuple[str, ...]
    expert_out_name: str
    expert_act: str
    expert_gated: bool
    accumulate: torch.dtype | None = None

    def __init__(self) -> None:
        super().__init__()
        self._routed: Experts | None = None

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._routed = self._restack()
        return self

    def _restack(self) -> Experts | None:
        first = getattr(self.experts[0], self.expert_in_names[0]).weight
        if first.device.type == "meta":
            return None
        w_in = _stack(self.experts, self.expert_in_names)
        w_out = _stack(self.experts, (self.expert_out_name,))
        return Experts(w_in, w_out, self.expert_act, self.expert_gated, list(self.experts), self.accumulate)

    def routed_experts(self) -> Experts:
        """The stacks (made again if a weight was replaced since the last move) and the expert modules."""
        routed = self._routed
        first = getattr(self.experts[0], self.expert_in_names[0]).weight
        if routed is None or first.data_ptr() != routed.w_in.data_ptr() or first.dtype != routed.w_in.dtype:
            routed = self._routed = self._restack()
            if routed is None:
                raise RuntimeError("MoE experts are still on the meta device")
        return routed
