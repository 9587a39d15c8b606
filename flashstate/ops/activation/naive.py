"""The gated activations in plain torch (the oracles)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from flashstate.ops.backend import dense_on_cpu


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up: [..., 2I] = [gate | up] → silu(gate) · up: [..., I], in gate_up's dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    # dense, as an unfused gate projection's output is: torch's CPU SiLU differs in the last bit on views
    return F.silu(gate.contiguous()) * up


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    """x · sigmoid(gate), same shapes (gate may be a strided view), in x's dtype."""
    return x * torch.sigmoid(dense_on_cpu(gate))
