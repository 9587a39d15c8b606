"""Several bias-free projections of one input computed by one GEMM, their checkpoint parameters kept.

Each `nn.Linear` keeps its own `weight` Parameter (HF name, shape, state_dict unchanged), but that
Parameter is a view of its rows in one stacked tensor [W_0; W_1; ...]: `stacked_linear(x)` gives every
output side by side. The stacking is re-made after every device or dtype move (`_apply`).

Block-FP8 projections (`Fp8Linear`) stack the same way, their `weight_scale_inv` rows stacked alongside,
when every projection's width is a whole number of 128-row blocks (then the stacked scales are the stacked
matrix's blocks). Otherwise, or when some projections are FP8 and others not (Qwen3-Next's FP8
checkpoints keep the 64-row in_proj_ba in bf16), each runs its own GEMM and the outputs are concatenated."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashstate.layers.fp8_linear import SCALE_SUFFIX, Fp8Linear
from flashstate.ops.fp8 import fp8_linear
from flashstate.ops.fp8.block_quant import BLOCK


def stack_rows(linears: list[nn.Module], attr: str = "weight") -> Tensor | None:
    """Copy the `attr` tensors of `linears` (same in_features) into consecutive rows of one new tensor and
    make each a view of its rows; returns the stacked tensor (None while the weights are on meta)."""
    weights = [getattr(m, attr) for m in linears]
    if weights[0].device.type == "meta":
        return None
    with torch.no_grad():
        stacked = torch.cat([w.detach() for w in weights])
    start = 0
    for m, w in zip(linears, weights, strict=True):
        setattr(m, attr, nn.Parameter(stacked[start : start + w.shape[0]], requires_grad=w.requires_grad))
        start += w.shape[0]
    return stacked


def is_stacked(stacked: Tensor | None, linears: list[nn.Module], attr: str = "weight") -> bool:
    """Whether `linears`' `attr` tensors are still the consecutive rows of `stacked` (none replaced)."""
    if stacked is None:
        return False
    row_bytes = stacked.stride(0) * stacked.element_size()
    start = 0
    for m in linears:
        w = getattr(m, attr)
        if w.dtype != stacked.dtype or w.data_ptr() != stacked.data_ptr() + start * row_bytes:
            return False
        start += w.shape[0]
    return start == stacked.shape[0]


def stacking(linears: list[nn.Module]) -> str:
    """How `linears` run: "dense" (one GEMM over the stacked weights), "fp8" (one block-FP8 GEMM over the
    stacked weights and scales) or "separate" (a GEMM each, outputs concatenated)."""
    fp8 = [isinstance(m, Fp8Linear) for m in linears]
    if not any(fp8):
        return "dense"
    if all(fp8) and all(m.out_features % BLOCK == 0 for m in linears):
        return "fp8"
    return "separate"


class StackedLinears(nn.Module):
    """Mixin for a module whose `stacked_names` Linear children run as one GEMM: `self.stacked_linear(x)`."""

    stacked_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self._stacked: Tensor | None = None
        self._stacked_scale: Tensor | None = None

    def _linears(self) -> list[nn.Module]:
        return [getattr(self, n) for n in self.stacked_names]

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        linears = self._linears()
        kind = stacking(linears)
        self._stacked = stack_rows(linears) if kind != "separate" else None
        self._stacked_scale = stack_rows(linears, SCALE_SUFFIX) if kind == "fp8" else None
        return self

    def _current(self, attr: str, stacked: Tensor | None) -> Tensor:
        linears = self._linears()
        if is_stacked(stacked, linears, attr):
            assert stacked is not None
            return stacked
        return torch.cat([getattr(m, attr) for m in linears])

    def stacked_weight(self) -> Tensor:
        """[Σ out_features, in_features]: the stacked tensor, or (if the weights were replaced since the
        last move) a concatenated copy. FP8 projections: their float8_e4m3fn rows."""
        return self._current("weight", self._stacked)

    def stacked_linear(self, x: Tensor) -> Tensor:
        """x [..., in] → every projection's output side by side, [..., Σ out_features], in x's dtype."""
        linears = self._linears()
        kind = stacking(linears)
        if kind == "dense":
            return F.linear(x, self.stacked_weight())
        if kind == "fp8":
            return fp8_linear(x, self.stacked_weight(), self._current(SCALE_SUFFIX, self._stacked_scale))
        return torch.cat([m(x) for m in linears], dim=-1)
