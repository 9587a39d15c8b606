from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def chunk_gated_delta_rule(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("gated_delta_rule", "fla", q).chunk_gated_delta_rule(q, *args, **kwargs)


def fused_recurrent_gated_delta_rule(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("gated_delta_rule", "fla", q).fused_recurrent_gated_delta_rule(q, *args, **kwargs)
