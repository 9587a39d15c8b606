"""Gated DeltaNet's gates in plain torch (the oracle)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.backend import dense_on_cpu


def gdn_gating(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:  # noqa: N803
    """a, b: [T, HV] (rows may be strided); A_log, dt_bias: [HV] → (g fp32, beta in b's dtype), [T, HV]."""
    beta = dense_on_cpu(b).sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta
