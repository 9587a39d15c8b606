"""Several bias-free projections of one input computed by one GEMM, their checkpoint parameters kept.

Each `nn.Linear` keeps its own `weight` Parameter (HF name, shape, state_dict unchanged), but that
Parameter is a view of its rows in one stacked tensor [W_0; W_1; ...]: `F.linear(x, stacked)` gives
every output side by side. The stacking is re-made after every device or dtype move (`_apply`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def stack_rows(linears: list[nn.Linear]) -> Tensor | None:
    """Copy the weights of `linears` (same in_features) into consecutive rows of one new tensor and make
    each weight a view of its rows; returns the stacked tensor (None while the weights are on meta)."""
    weights = [m.weight for m in linears]
    if weights[0].device.type == "meta":
        return None
    with torch.no_grad():
        stacked = torch.cat([w.detach() for w in weights])
    start = 0
    for m, w in zip(linears, weights, strict=True):
        m.weight = nn.Parameter(stacked[start : start + w.shape[0]], requires_grad=w.requires_grad)
        start += w.shape[0]
    return stacked


def is_stacked(stacked: Tensor | None, linears: list[nn.Linear]) -> bool:
    """Whether `linears`' weights are still the consecutive rows of `stacked` (no one replaced them)."""
    if stacked is None:
        return False
    row_bytes = stacked.stride(0) * stacked.element_size()
    start = 0
    for m in linears:
        w = m.weight
        if w.dtype != stacked.dtype or w.data_ptr() != stacked.data_ptr() + start * row_bytes:
            return False
        start += w.shape[0]
    return start == stacked.shape[0]


class StackedLinears(nn.Module):
    """Mixin for a module whose `stacked_names` Linear children run as one GEMM: `self.stacked_weight()`."""

    stacked_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self._stacked: Tensor | None = None

    def _linears(self) -> list[nn.Linear]:
        return [getattr(self, n) for n in self.stacked_names]

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._stacked = stack_rows(self._linears())
        return self

    def stacked_weight(self) -> Tensor:
        """[Σ out_features, in_features]: the stacked tensor, or (if the weights were replaced since the
        last move) a concatenated copy."""
        linears = self._linears()
        if is_stacked(self._stacked, linears):
            assert self._stacked is not None
            return self._stacked
        return torch.cat([m.weight for m in linears])
