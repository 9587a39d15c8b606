"""An MoE block's expert weights kept as two stacked tensors that the fused kernels read, with every
expert's checkpoint parameters (HF names, shapes, state_dict unchanged) views of their rows.

After every device or dtype move (`_apply`): w_in[e] = [in_names' weights of expert e, rows side by
side], w_out[e] = its `out_name` weight. In-place loads (`param.copy_`) keep the views; a replaced
Parameter is noticed on the first expert and the stacks are made again.

Block-FP8 experts (`Fp8Linear`, every expert the same): the float8_e4m3fn weights stack as above and their
`weight_scale_inv` the same way, w_in_scale [E, Σ ceil(rows/128), ceil(in/128)] and w_out_scale
[E, ceil(D/128), ceil(I/128)]. Stacking gate and up rows is only a valid block layout when each part's rows
are whole 128-row blocks; otherwise the model is refused (no FP8 experts of that width)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flashstate.layers.fp8_linear import SCALE_SUFFIX, Fp8Linear
from flashstate.layers.stacked_linear import StackedLinears
from flashstate.ops.fp8.block_quant import BLOCK
from flashstate.ops.moe import Experts


def _stack(experts: nn.ModuleList, names: tuple[str, ...], attr: str = "weight") -> Tensor:
    """[E, Σ rows, in] copied from each expert's `names` `attr` tensors, each made a view of its rows."""
    first = [getattr(getattr(experts[0], n), attr) for n in names]
    rows = sum(w.shape[0] for w in first)
    stacked = torch.empty(len(experts), rows, first[0].shape[1], dtype=first[0].dtype, device=first[0].device)
    for e, ex in enumerate(experts):
        start = 0
        for n in names:
            linear = getattr(ex, n)
            w = getattr(linear, attr)
            view = stacked[e, start : start + w.shape[0]]
            with torch.no_grad():
                view.copy_(w)
            setattr(linear, attr, nn.Parameter(view, requires_grad=w.requires_grad))
            start += w.shape[0]
        if isinstance(ex, StackedLinears) and ex.stacked_names == names:
            # the expert's own stacked GEMM weight (scales) are the same rows
            if attr == "weight":
                ex._stacked = stacked[e]
            else:
                ex._stacked_scale = stacked[e]
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

    def _fp8(self) -> bool:
        """Whether the experts hold block-FP8 weights (all of them, or none: anything else is refused)."""
        names = (*self.expert_in_names, self.expert_out_name)
        kinds = {isinstance(getattr(ex, n), Fp8Linear) for ex in self.experts for n in names}
        if len(kinds) > 1:
            raise ValueError(
                f"MoE experts ({', '.join(names)}) are partly FP8: a quantized checkpoint must quantize "
                "every routed expert's projections or none"
            )
        if True not in kinds:
            return False
        for n in self.expert_in_names:
            rows = getattr(self.experts[0], n).out_features
            if len(self.expert_in_names) > 1 and rows % BLOCK:
                raise ValueError(
                    f"FP8 MoE experts: {n} has {rows} rows, not a multiple of {BLOCK}, so its block scales "
                    f"cannot be stacked with {', '.join(x for x in self.expert_in_names if x != n)}'s; this "
                    "model's experts cannot run in block FP8"
                )
        return True

    def _restack(self) -> Experts | None:
        first = getattr(self.experts[0], self.expert_in_names[0]).weight
        if first.device.type == "meta":
            return None
        w_in = _stack(self.experts, self.expert_in_names)
        w_out = _stack(self.experts, (self.expert_out_name,))
        scales = {}
        if self._fp8():
            scales["w_in_scale"] = _stack(self.experts, self.expert_in_names, SCALE_SUFFIX)
            scales["w_out_scale"] = _stack(self.experts, (self.expert_out_name,), SCALE_SUFFIX)
        return Experts(
            w_in, w_out, self.expert_act, self.expert_gated, list(self.experts), self.accumulate, **scales
        )

    def routed_experts(self) -> Experts:
        """The stacks (made again if a weight was replaced since the last move) and the expert modules."""
        routed = self._routed
        first = getattr(self.experts[0], self.expert_in_names[0]).weight
        if routed is None or first.data_ptr() != routed.w_in.data_ptr() or first.dtype != routed.w_in.dtype:
            routed = self._routed = self._restack()
            if routed is None:
                raise RuntimeError("MoE experts are still on the meta device")
        return routed
