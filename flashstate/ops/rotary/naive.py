"""Rotary position embedding in plain torch, in place (the oracle)."""

from __future__ import annotations

from torch import Tensor


def apply_rotary_(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, H, D]; cos, sin: [T, R] (R ≤ D even, equal halves). Rotates x[..., :R] in place, halves
    layout: (x1, x2) → (x1·c − x2·s, x2·c + x1·s); x[..., R:] is left as it is. Returns x."""
    h = cos.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h : 2 * h]
    c, s = cos[:, None, :h], sin[:, None, :h]
    o1 = x1 * c - x2 * s
    x2.copy_(x2 * c + x1 * s)
    x1.copy_(o1)
    return x
