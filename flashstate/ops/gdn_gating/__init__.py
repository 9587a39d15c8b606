"""Gated DeltaNet's gates from its `in_proj_ba` output: the log decay g = −exp(A_log) · softplus(a + dt_bias)
(fp32) and the write strength beta = sigmoid(b) (b's dtype), [T, HV] each."""

from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def gdn_gating(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:  # noqa: N803
    """The Triton kernel for CUDA tensors (one launch instead of six), the naive oracle otherwise."""
    return backend("gdn_gating", "triton", a).gdn_gating(a, b, A_log, dt_bias)
