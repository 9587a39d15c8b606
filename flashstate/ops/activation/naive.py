"""SwiGLU's gate in plain torch (the oracle)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up: [..., 2I] = [gate | up] → silu(gate) · up: [..., I], in gate_up's dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    # dense, as an unfused gate projection's output is: torch's CPU SiLU differs in the last bit on views
    return F.silu(gate.contiguous()) * up
