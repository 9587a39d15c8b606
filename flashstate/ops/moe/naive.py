"""The MoE experts' oracle: per selected expert, its tokens gathered, the expert run, the output times
the routing weight added back per token (`index_add_`). It reads the selected experts on the host
(`unique().tolist()`): a device wait per layer, so CUDA graphs cannot capture it. FP8 stacks are
dequantized per expert to x's dtype (the block scales applied in fp32, then cast)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.fp8.block_quant import dequantize_block
from flashstate.ops.moe.experts import Experts


def _act(experts: Experts, u: Tensor) -> Tensor:
    if experts.gated:
        gate, up = u.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.relu(u).square() if experts.act == "relu2" else F.silu(u)


def stacked_expert(experts: Experts, e: int) -> Callable[[Tensor], Tensor]:
    """Expert `e` computed from the stacks: w_out[e] · act(w_in[e] · x), in x's dtype."""
    if experts.fp8:

        def run(x: Tensor) -> Tensor:
            w_in = dequantize_block(experts.w_in[e], experts.w_in_scale[e], x.dtype)
            w_out = dequantize_block(experts.w_out[e], experts.w_out_scale[e], x.dtype)
            return F.linear(_act(experts, F.linear(x, w_in)), w_out)

        return run
    return lambda x: F.linear(_act(experts, F.linear(x, experts.w_in[e])), experts.w_out[e])


def moe_experts(x: Tensor, weights: Tensor, ids: Tensor, experts: Experts) -> Tensor:
    """x [T, D], weights [T, k] (any float dtype: each expert output is multiplied by it in torch's
    promotion), ids [T, k] → Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]): [T, D] in x's dtype, summed in
    `experts.accumulate` (x's dtype when None), experts in ascending id order."""
    out = torch.zeros(x.shape, dtype=experts.accumulate or x.dtype, device=x.device)
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)
        run = experts.modules[e] if experts.modules is not None else stacked_expert(experts, e)
        out.index_add_(0, token, (run(x[token]) * weights[token, slot, None]).to(out.dtype))
    return out.to(x.dtype)
