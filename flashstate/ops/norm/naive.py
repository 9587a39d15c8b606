"""RMSNorm in plain torch (the oracle of `triton.rms_norm`)."""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """x / rms(x) · (offset + w) over the last dim, in fp32, cast back to x's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (offset + weight.float())).to(x.dtype)
