from __future__ import annotations

from torch import Tensor

from flashstate.ops.backend import backend


def chunk_gated_delta_rule(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("gated_delta_rule", "fla", q).chunk_gated_delta_rule(q, *args, **kwargs)


def fused_recurrent_gated_delta_rule(q: Tensor, *args, **kwargs):
    """The GPU kernel for CUDA tensors, the naive oracle otherwise (same contract)."""
    return backend("gated_delta_rule", "fla", q).fused_recurrent_gated_delta_rule(q, *args, **kwargs)


def decode_gated_delta_rule_in_place(q: Tensor, *args, **kwargs):
    """One token per sequence, the gates included: one Triton kernel for CUDA tensors, the naive gates and
    recurrent step otherwise (same contract)."""
    ops = backend("gated_delta_rule", "decode_triton", q)
    return ops.decode_gated_delta_rule_in_place(q, *args, **kwargs)
